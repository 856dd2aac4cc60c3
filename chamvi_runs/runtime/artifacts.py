"""Attachments: bytes live in Django storage; histories keep ``chamvi-artifact:<id>`` references, and
every execution reads the bytes again when it sends the history to the model."""

from __future__ import annotations

import base64
import copy
import mimetypes
from typing import Any

from django.core.files.base import ContentFile, File

from ..core.messages import ARTIFACT_SCHEME
from ..core.types import Message
from ..errors import ArtifactNotFound
from ..models import Artifact


def save_artifact(content: bytes | File, filename: str, media_type: str | None = None) -> Artifact:
    """Store an attachment for ``start_run(attachments=[...])``."""
    data = content if isinstance(content, File) else ContentFile(content)
    media_type = media_type or mimetypes.guess_type(filename)[0] or "application/octet-stream"
    artifact = Artifact(filename=filename, media_type=media_type, size=data.size or 0)
    artifact.file.save(filename, data, save=False)
    artifact.save()
    return artifact


class ArtifactReader:
    """Resolves references for one execution; each artifact is read at most once per execution."""

    def __init__(self) -> None:
        self._cache: dict[str, str] = {}

    def _data_url(self, artifact_id: str, media_type: str) -> str:
        if artifact_id not in self._cache:
            artifact = Artifact.objects.filter(pk=artifact_id).first()
            if artifact is None:
                raise ArtifactNotFound(f"artifact {artifact_id} does not exist")
            try:
                with artifact.file.open("rb") as handle:
                    raw = handle.read()
            except (FileNotFoundError, OSError, ValueError) as exc:
                raise ArtifactNotFound(f"artifact {artifact_id}: {exc}") from None
            encoded = base64.b64encode(raw).decode()
            self._cache[artifact_id] = f"data:{media_type};base64,{encoded}"
        return self._cache[artifact_id]

    def hydrate(self, messages: list[Message]) -> list[Message]:
        """A copy of ``messages`` with every artifact reference replaced by its bytes, as an
        ``image_url`` part for images and a ``file`` part otherwise."""
        out = []
        for message in messages:
            content = message.get("content")
            if not isinstance(content, list) or not any(_is_ref(p) for p in content):
                out.append(message)
                continue
            message = copy.copy(message)
            message["content"] = [self._part(p) if _is_ref(p) else p for p in content]
            out.append(message)
        return out

    def _part(self, part: dict[str, Any]) -> dict[str, Any]:
        file = part["file"]
        artifact_id = file["file_data"].removeprefix(ARTIFACT_SCHEME)
        media_type = file.get("media_type") or "application/octet-stream"
        url = self._data_url(artifact_id, media_type)
        if media_type.startswith("image/"):
            return {"type": "image_url", "image_url": {"url": url}}
        return {"type": "file", "file": {"file_data": url, "filename": file.get("filename", artifact_id)}}


def _is_ref(part: Any) -> bool:
    return (
        isinstance(part, dict)
        and part.get("type") == "file"
        and str(part.get("file", {}).get("file_data", "")).startswith(ARTIFACT_SCHEME)
    )

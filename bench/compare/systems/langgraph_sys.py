"""LangGraph: a ``StateGraph(MessagesState)`` of a ``ChatOpenAI`` node (streaming, usage on) and a
``ToolNode``, checkpointed by ``PostgresSaver`` after every super-step, with LangGraph's default
durability (``"async"``: a checkpoint is written while the next step starts). Runs one after another
in this process, each on a thread of its own, consumed with ``stream_mode="messages"`` as an app
streaming tokens would. Runs in its own venv (bench/compare/venvs.py)."""

from __future__ import annotations

import os
import uuid
from typing import Annotated, Any

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.tools import InjectedToolCallId, tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from psycopg import Connection
from psycopg.rows import dict_row

from bench.compare import workload
from bench.compare.systems.driver import config, serve


@tool
def lookup_order(order_id: str) -> dict:
    """Look up an order by id, for example A-1001."""
    return workload.lookup_order(order_id)


@tool
def check_refund_policy(order_id: str, reason: str) -> dict:
    """Check whether an order may be refunded, and how much."""
    return workload.check_refund_policy(order_id, reason)


@tool
def issue_refund(order_id: str, amount_cents: int, tool_call_id: Annotated[str, InjectedToolCallId]) -> dict:
    """Refund part or all of an order."""
    return workload.issue_refund(order_id, amount_cents, key=tool_call_id)


TOOLS = [lookup_order, check_refund_policy, issue_refund]


class LangGraph:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.worker_pid = os.getpid()
        self.conn = Connection.connect(cfg["dsn"], autocommit=True, prepare_threshold=0, row_factory=dict_row)
        saver = PostgresSaver(self.conn)  # type: ignore[arg-type]
        saver.setup()
        llm = ChatOpenAI(
            model=cfg["model"],
            base_url=cfg["base_url"],
            api_key="bench",  # type: ignore[arg-type]
            streaming=True,
            stream_usage=True,
            max_retries=0,
        ).bind_tools(TOOLS)

        def agent(state: MessagesState) -> dict[str, Any]:
            return {"messages": [llm.invoke([SystemMessage(workload.INSTRUCTIONS), *state["messages"]])]}

        graph = StateGraph(MessagesState)
        graph.add_node("agent", agent)
        graph.add_node("tools", ToolNode(TOOLS))
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", tools_condition)
        graph.add_edge("tools", "agent")
        self.graph = graph.compile(checkpointer=saver)
        self.answers: list[str] = []

    def run_batch(self, runs: int) -> dict[str, Any]:
        self.answers = [self._run() for _ in range(runs)]
        return {}

    def _run(self) -> str:
        config = {"configurable": {"thread_id": str(uuid.uuid4())}}
        last: dict[str, Any] = {}
        for mode, payload in self.graph.stream(
            {"messages": [HumanMessage(workload.USER_MESSAGE)]},
            config,  # type: ignore[arg-type]
            stream_mode=["messages", "values"],
        ):
            if mode == "values":
                last = payload  # type: ignore[assignment]
        final = last["messages"][-1]
        return str(final.content) if isinstance(final, AIMessage) else ""

    def verify(self) -> None:
        wrong = [a for a in self.answers if a != workload.FINAL_TEXT]
        if wrong:
            raise AssertionError(f"{len(wrong)} runs ended with another answer: {wrong[0]!r}")

    def close(self) -> None:
        self.conn.close()


if __name__ == "__main__":
    cfg = config()
    serve(LangGraph(cfg), cfg)

// A small DOM for the pages' scripts under `node --test`: elements with attributes, classes and
// children, the selectors the pages use (tag, #id, .class, [name=value], descendants, lists), forms'
// named fields, and events the test dispatches. Text is kept as strings among the children.

const camel = (name) => name.replace(/-(\w)/g, (_, letter) => letter.toUpperCase());

export class FakeElement {
  constructor(tag, attributes = {}, children = []) {
    this.tagName = tag.toUpperCase();
    this.attributes = {};
    this.dataset = {};
    this.children = [];
    this.parent = null;
    this.listeners = {};
    this.value = "";
    this.hidden = false;
    this.disabled = false;
    for (const [name, value] of Object.entries(attributes)) this.setAttribute(name, value);
    this.append(...children);
  }

  setAttribute(name, value) {
    if (name.startsWith("data-")) this.dataset[camel(name.slice(5))] = String(value);
    else if (name === "value") this.value = String(value);
    else if (name === "hidden") this.hidden = true;
    else this.attributes[name] = String(value);
  }

  getAttribute(name) {
    return (name.startsWith("data-") ? this.dataset[camel(name.slice(5))] : this.attributes[name]) ?? null;
  }

  get id() { return this.attributes.id ?? ""; }
  set id(id) { this.attributes.id = id; }
  get className() { return this.attributes.class ?? ""; }
  set className(name) { this.attributes.class = name; }

  get textContent() {
    return this.children.map((child) => (typeof child === "string" ? child : child.textContent)).join("");
  }

  set textContent(text) {
    this.replaceChildren(...(text === "" ? [] : [String(text)]));
  }

  get firstChild() { return this.children[0] ?? null; }

  get nextSibling() {
    const siblings = this.parent?.children ?? [];
    return siblings[siblings.indexOf(this) + 1] ?? null;
  }

  append(...nodes) {
    for (const node of nodes) this.insertBefore(node, null);
  }

  insertBefore(node, before) {
    if (typeof node !== "string") {
      node.remove();
      node.parent = this;
    }
    const at = before === null ? -1 : this.children.indexOf(before);
    this.children.splice(at < 0 ? this.children.length : at, 0, node);
  }

  after(node) {
    this.parent.insertBefore(node, this.nextSibling);
  }

  replaceWith(node) {
    this.parent.insertBefore(node, this);
    this.remove();
  }

  remove() {
    if (!this.parent) return;
    this.parent.children.splice(this.parent.children.indexOf(this), 1);
    this.parent = null;
  }

  replaceChildren(...nodes) {
    for (const child of this.children) if (typeof child !== "string") child.parent = null;
    this.children = [];
    this.append(...nodes);
  }

  get elements() {
    return Object.fromEntries(this.querySelectorAll("[name]").reverse().map((field) => [field.attributes.name, field]));
  }

  *descendants() {
    for (const child of this.children) {
      if (typeof child === "string") continue;
      yield child;
      yield* child.descendants();
    }
  }

  querySelectorAll(selector) {
    return [...this.descendants()].filter((node) => node.matches(selector));
  }

  querySelector(selector) {
    return this.querySelectorAll(selector)[0] ?? null;
  }

  closest(selector) {
    for (let node = this; node; node = node.parent) if (node.matches(selector)) return node;
    return null;
  }

  matches(selector) {
    return selector.split(",").some((one) => {
      const [last, ...ancestors] = one.trim().split(/\s+/).reverse();
      if (!this.is(last)) return false;
      let node = this.parent;
      for (const compound of ancestors) {
        while (node && !node.is(compound)) node = node.parent;
        if (!node) return false;
        node = node.parent;
      }
      return true;
    });
  }

  /** Whether this element matches one compound selector: `tag#id.class[name=value]`. */
  is(compound) {
    const classes = this.className.split(/\s+/);
    return [...compound.matchAll(/([#.]?)([\w-]+)|\[([\w-]+)(?:=["']?([^"'\]]*)["']?)?\]/g)].every(
      ([, sigil, name, attribute, value]) => {
        if (attribute) return this.getAttribute(attribute) !== null && (value === undefined || this.getAttribute(attribute) === value);
        if (sigil === "#") return this.id === name;
        if (sigil === ".") return classes.includes(name);
        return this.tagName === name.toUpperCase();
      },
    );
  }

  addEventListener(type, listener) {
    (this.listeners[type] ??= []).push(listener);
  }

  /** Dispatches a `type` event with `fields` (a submit's `submitter`, say); returns the event. */
  dispatch(type, fields = {}) {
    const event = {type, target: this, defaultPrevented: false, preventDefault() { this.defaultPrevented = true; }, ...fields};
    for (const listener of this.listeners[type] ?? []) listener(event);
    return event;
  }
}

export const h = (tag, attributes = {}, ...children) => new FakeElement(tag, attributes, children);

/** A document whose body holds `children`; it has no cookie, as with CSRF_COOKIE_HTTPONLY. */
export function fakeDocument(...children) {
  const body = h("body", {}, ...children);
  return {
    body,
    getElementById: (id) => body.querySelector(`#${id}`),
    querySelector: (selector) => body.querySelector(selector),
    querySelectorAll: (selector) => body.querySelectorAll(selector),
    createElement: (tag) => new FakeElement(tag),
  };
}

/** Sets globals (document, fetch, …) for a page's script; returns a function that puts them back. */
export function withGlobals(globals) {
  const saved = Object.entries(globals).map(([name]) => [name, Object.getOwnPropertyDescriptor(globalThis, name)]);
  for (const [name, value] of Object.entries(globals)) {
    Object.defineProperty(globalThis, name, {value, configurable: true, writable: true});
  }
  return () => {
    for (const [name, descriptor] of saved) {
      if (descriptor) Object.defineProperty(globalThis, name, descriptor);
      else delete globalThis[name];
    }
  };
}

/** A small element builder. Text always goes in as text nodes, never as HTML (job names and log
 * lines come from users' code). */
export type Child = Node | string | null | undefined | false;

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attributes: Record<string, string | number | boolean | undefined> = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === false) {
      continue;
    }
    element.setAttribute(name, value === true ? '' : String(value));
  }
  append(element, ...children);
  return element;
}

export function append(parent: Node, ...children: Child[]): void {
  for (const child of children) {
    if (child === null || child === undefined || child === false) {
      continue;
    }
    parent.appendChild(typeof child === 'string' ? document.createTextNode(child) : child);
  }
}

export function replaceChildren(parent: HTMLElement, ...children: Child[]): void {
  while (parent.firstChild) {
    parent.removeChild(parent.firstChild);
  }
  append(parent, ...children);
}

/**
 * The badge of a job's display word (`displayState`: the same word the widget and `%cortex jobs` show),
 * used in the sidebar and the job view; colour comes from the word's CSS class.
 */
export function wordBadge(word: string): HTMLElement {
  return h('span', { class: `cortex-badge cortex-word-${word}`, 'data-word': word }, word);
}

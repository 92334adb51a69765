/**
 * A cell record that survives: every cortex widget output carries, next to its widget view, a static
 * `text/html` picture (the kernel rewrites it as the run moves). Where the widget cannot be shown (its
 * model is gone after a kernel restart or a reopen: "Error displaying widget: model not found"), or its
 * view is cut off from its kernel (ipywidgets marks it `jupyter-widgets-disconnected` and covers it in
 * broken-link icons), the output shows that picture instead.
 *
 * No notebook package is imported: notebook panels are read through the few members used here, so the
 * panel keeps its dependencies; `brokenWidget` and `pictureOf` are pure and unit-tested with jest. The
 * sanitizer is passed in (JupyterLab's, from apputils) for pictures in untrusted outputs.
 */

/** What cleans HTML of an untrusted output (JupyterLab's `Sanitizer`). */
export type Sanitize = (html: string) => string;
export const WIDGET_VIEW_MIME = 'application/vnd.jupyter.widget-view+json';
export const RECORD_CLASS = 'cortex-cell-record';
/** The classes our pictures carry (cortex_nb/widgets: job_view.STATIC_CLASS, compare_widget.static_html). */
const PICTURE_CLASSES = ['cortex-job-static', 'cortex-compare-static', 'cortex-run-static'];
const MODEL_NOT_FOUND = 'Error displaying widget';

/** The picture next to a cortex widget view in an output's data, or null for any other output. */
export function pictureOf(data: Record<string, unknown>): string | null {
  const html = data['text/html'];
  const text = Array.isArray(html) ? html.join('') : html;
  if (!(WIDGET_VIEW_MIME in data) || typeof text !== 'string') {
    return null;
  }
  return PICTURE_CLASSES.some(name => text.includes(`class="${name}"`)) ? text : null;
}

/** Whether an output's widget view cannot show the run: its model is missing, or its kernel is gone. */
export function brokenWidget(renderedText: string, disconnected: boolean): boolean {
  return disconnected || renderedText.trim().startsWith(MODEL_NOT_FOUND);
}

/** The members of a notebook panel's cells this module reads (JupyterLab's CodeCell and OutputArea). */
interface IOutputModelLike {
  data: Record<string, unknown>;
  trusted: boolean;
}
interface IOutputAreaLike {
  model: { length: number; get(index: number): IOutputModelLike };
  widgets: ReadonlyArray<{ node: HTMLElement }>;
}
interface ICellLike {
  outputArea?: IOutputAreaLike;
}

/** Replace each broken cortex widget in these cells by its picture; returns how many were replaced. */
export function showRecords(cells: Iterable<ICellLike>, sanitize: Sanitize): number {
  let replaced = 0;
  for (const cell of cells) {
    const area = cell.outputArea;
    if (!area) {
      continue;
    }
    for (let index = 0; index < area.model.length && index < area.widgets.length; index++) {
      const output = area.model.get(index);
      const picture = pictureOf(output.data);
      const node = area.widgets[index].node;
      if (!picture || node.querySelector(`.${RECORD_CLASS}`)) {
        continue;
      }
      const rendered = node.querySelector('.jp-OutputArea-output') as HTMLElement | null;
      const disconnected = node.querySelector('.jupyter-widgets-disconnected') !== null;
      if (!rendered || !brokenWidget(rendered.textContent ?? '', disconnected)) {
        continue;
      }
      const record = document.createElement('div');
      record.className = `${RECORD_CLASS} jp-RenderedHTMLCommon`;
      // Trusted outputs render their HTML as written (as JupyterLab itself does); others go through the sanitizer.
      record.innerHTML = output.trusted ? picture : sanitize(picture);
      rendered.style.display = 'none';
      rendered.parentElement?.appendChild(record);
      replaced++;
    }
  }
  return replaced;
}

/** The cells of every open notebook: main-area widgets whose content holds cells with output areas. */
export type CellSource = () => Iterable<ICellLike>;

/**
 * Watch the page: whenever outputs change (a widget failing to find its model, a view marked
 * disconnected), look again, at most a few times a second. Returns the function that stops.
 */
export function installCellRecords(root: HTMLElement, cells: CellSource, sanitize: Sanitize): () => void {
  let scheduled: number | null = null;
  const scan = (): void => {
    scheduled = null;
    showRecords(cells(), sanitize);
  };
  const observer = new MutationObserver(() => {
    if (scheduled === null) {
      scheduled = window.setTimeout(scan, 250);
    }
  });
  observer.observe(root, { subtree: true, childList: true, attributes: true, attributeFilter: ['class'] });
  return () => observer.disconnect();
}

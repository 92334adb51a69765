/**
 * A cell record that survives: every cortex widget output carries, next to its widget view, a static
 * `text/html` picture (the kernel rewrites it as the run moves). Where the widget cannot be shown (its
 * model is gone after a kernel restart or a reopen: "Error displaying widget: model not found"), or its
 * view is cut off from its kernel (ipywidgets marks it `jupyter-widgets-disconnected` and covers it in
 * broken-link icons), the output shows that picture instead.
 *
 * A picture drawn while its run was still going stays where the run was then. Once the run has ended and
 * no kernel can reach that output any more (its widget is broken, or it is a bare picture), the output is
 * rewritten with the run's final picture, drawn by the server extension (`cortex/api/record/{job}`), so
 * the notebook saves it: after a kernel restart the widget reattached in a new kernel cannot (JupyterLab
 * forgot the display id), so the first cell says where the run went, "continued in cell N", as the
 * kernel's own rewrite would have.
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

/** The job a job picture shows (its `data-cortex-job`), or null for any other HTML. */
export function pictureJob(html: string): string | null {
  const match = /class="cortex-job-static" data-cortex-job="([^"]+)"/.exec(html);
  return match ? match[1] : null;
}

/** Whether a job picture was drawn while its run was still going ("picture as of …", job_view.py). */
export function pictureIsLive(html: string): boolean {
  return html.includes('class="cortex-picture-note"');
}

/** An output in the nbformat shape, as the output area's model takes it. */
export interface IOutputJSON {
  output_type: string;
  data?: Record<string, unknown>;
  metadata?: Record<string, unknown>;
  [key: string]: unknown;
}

/** The members of a notebook panel's cells this module reads (JupyterLab's CodeCell and OutputArea). */
interface IOutputModelLike {
  data: Record<string, unknown>;
  trusted: boolean;
}
interface IOutputAreaLike {
  model: { length: number; get(index: number): IOutputModelLike; set(index: number, output: IOutputJSON): void };
  widgets: ReadonlyArray<{ node: HTMLElement }>;
}
export interface ICellLike {
  outputArea?: IOutputAreaLike;
  model?: { executionCount?: number | null };
}

/** What the server extension draws: the job's picture now (its final one once ended). */
export interface IDrawnRecord {
  job_id: string;
  status: string;
  finished: boolean;
  html: string;
  text: string;
}

/** A cell output showing a run's picture that no kernel will bring up to date. */
export interface IStaleRecord {
  cell: ICellLike;
  index: number;
  jobId: string;
  /** The number of another cell of the notebook that shows the same run live or whole, if any. */
  continuedIn: number | null;
}

function htmlOf(data: Record<string, unknown>): string | null {
  const html = data['text/html'];
  const text = Array.isArray(html) ? html.join('') : html;
  return typeof text === 'string' ? text : null;
}

/**
 * The trusted outputs of one notebook's cells whose run has ended (`ended`) while they still show it
 * going, and which no kernel can rewrite: a widget whose view was replaced by its record (see showRecords), or
 * a bare picture. Each names the cell that took the run over, when another cell shows it and is not
 * itself stale (the widget `%cortex job ID` reattached after a kernel restart).
 */
export function staleRecords(cells: ICellLike[], ended: (jobId: string) => boolean): IStaleRecord[] {
  const stale: IStaleRecord[] = [];
  const holders = new Map<string, ICellLike[]>(); // job → cells whose output shows it and is current
  for (const cell of cells) {
    const area = cell.outputArea;
    if (!area) {
      continue;
    }
    for (let index = 0; index < area.model.length; index++) {
      const output = area.model.get(index);
      const data = output.data;
      const html = htmlOf(data);
      const jobId = html ? pictureJob(html) : null;
      if (!html || !jobId) {
        continue;
      }
      const widget = WIDGET_VIEW_MIME in data;
      const node = area.widgets[index]?.node;
      const cutOff = !widget || (node?.querySelector(`.${RECORD_CLASS}`) ?? null) !== null;
      // Only trusted outputs (this user's own, run here or signed): a notebook from elsewhere must not get
      // this user's runs drawn into it by naming their ids.
      if (cutOff && pictureIsLive(html) && ended(jobId) && output.trusted) {
        stale.push({ cell, index, jobId, continuedIn: null });
      } else if (!cutOff || !pictureIsLive(html)) {
        holders.set(jobId, [...(holders.get(jobId) ?? []), cell]);
      }
    }
  }
  for (const record of stale) {
    const other = (holders.get(record.jobId) ?? []).find(cell => cell !== record.cell);
    record.continuedIn = other?.model?.executionCount ?? null;
  }
  return stale;
}

/** The output that replaces a stale record: the drawn picture as plain HTML (what a kernel freezes to). */
export function recordOutput(drawn: IDrawnRecord): IOutputJSON {
  return {
    output_type: 'display_data',
    data: { 'text/html': drawn.html, 'text/plain': drawn.text },
    metadata: {}
  };
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

/** The cells of each open notebook: main-area widgets whose content holds cells with output areas. */
export type NotebookSource = () => Iterable<ICellLike[]>;

/** How stale records are brought up to date: which runs have ended, and the server's drawing of one. */
export interface IRecordSource {
  ended(jobId: string): boolean;
  draw(jobId: string, continuedIn: number | null): Promise<IDrawnRecord>;
}

/** Rewrites stale records, one drawing per run at a time; a failed drawing is tried again a minute on. */
export class RecordRefresher {
  private _drawing = new Set<string>();
  private _failedAt = new Map<string, number>();

  constructor(private _source: IRecordSource, private _retryMs = 60_000) {}

  refresh(notebooks: Iterable<ICellLike[]>): void {
    for (const cells of notebooks) {
      for (const record of staleRecords(cells, jobId => this._source.ended(jobId))) {
        const key = `${record.jobId}:${record.continuedIn ?? ''}`;
        const failed = this._failedAt.get(key);
        if (this._drawing.has(key) || (failed !== undefined && Date.now() - failed < this._retryMs)) {
          continue;
        }
        this._drawing.add(key);
        this._source
          .draw(record.jobId, record.continuedIn)
          .then(drawn => {
            const area = record.cell.outputArea;
            const current = area && record.index < area.model.length ? htmlOf(area.model.get(record.index).data) : null;
            // Only the output it was drawn for, and only an ending: a live picture would be stale again.
            if (area && drawn.finished && current && pictureJob(current) === record.jobId && pictureIsLive(current)) {
              area.model.set(record.index, recordOutput(drawn));
            }
          })
          .catch(() => this._failedAt.set(key, Date.now()))
          .finally(() => this._drawing.delete(key));
      }
    }
  }
}

/**
 * Watch the page: whenever outputs change (a widget failing to find its model, a view marked
 * disconnected), and whenever `onJobs` says the runs changed, look again, at most a few times a second.
 * Returns the function that stops.
 */
export function installCellRecords(
  root: HTMLElement,
  notebooks: NotebookSource,
  sanitize: Sanitize,
  records?: { source: IRecordSource; onJobs(listener: () => void): () => void }
): () => void {
  const refresher = records ? new RecordRefresher(records.source) : null;
  let scheduled: number | null = null;
  const scan = (): void => {
    scheduled = null;
    const cells = Array.from(notebooks());
    showRecords(
      cells.flatMap(notebook => notebook),
      sanitize
    );
    refresher?.refresh(cells);
  };
  const schedule = (): void => {
    if (scheduled === null) {
      scheduled = window.setTimeout(scan, 250);
    }
  };
  const observer = new MutationObserver(schedule);
  observer.observe(root, { subtree: true, childList: true, attributes: true, attributeFilter: ['class'] });
  const unsubscribe = records?.onJobs(schedule);
  return () => {
    observer.disconnect();
    unsubscribe?.();
  };
}

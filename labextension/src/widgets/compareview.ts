/**
 * Two or more trainings side by side in the main area: their loss per token curves overlaid (eval
 * dashed, each training in its colour) and a table of settings and final figures.
 */
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { CortexApi, CortexApiError } from '../api';
import { SERIES_CLASSES, lossChart } from '../charts/losschart';
import { ICompareRow, compareRow, differingColumns } from '../compare';
import { h, replaceChildren } from '../dom';
import { formatDuration, formatLoss, formatRate } from '../format';
import { isTerminal, jobTitle } from '../jobrows';
import { IJobView } from '../types';

const COLUMNS: Array<[keyof ICompareRow, string, (row: ICompareRow) => string]> = [
  ['model', 'model', row => row.model],
  ['loraRank', 'LoRA r', row => (row.loraRank === null ? '–' : String(row.loraRank))],
  ['learningRate', 'lr', row => (row.learningRate === null ? '–' : String(row.learningRate))],
  ['batchSize', 'batch', row => (row.batchSize === null ? '–' : String(row.batchSize))],
  ['seed', 'seed', row => (row.seed === null ? '–' : String(row.seed))],
  ['steps', 'steps', row => (row.steps === null ? '–' : String(row.steps))],
  ['finalLoss', 'final loss per token', row => formatLoss(row.finalLoss)],
  ['finalEval', 'final eval loss per token', row => formatLoss(row.finalEval)],
  ['durationS', 'took', row => formatDuration(row.durationS)],
  ['tokensPerS', 'tokens/s', row => formatRate(row.tokensPerS, 'tok/s') || '–']
];

export class CompareView extends Widget {
  jobs: IJobView[] = [];
  private _error: string | null = null;
  private _poll: Poll;
  private _body = h('div', { class: 'cortex-compare-body' });

  constructor(
    private readonly _api: CortexApi,
    readonly jobIds: string[]
  ) {
    super();
    this.addClass('cortex-job-view');
    this.addClass('cortex-compare-view');
    this.id = `cortex-compare-${jobIds.join('-')}`;
    this.title.label = `Compare ${jobIds.length} trainings`;
    this.title.caption = `cortex-nb: ${jobIds.join(', ')}`;
    this.title.closable = true;
    this.node.appendChild(this._body);
    this._poll = new Poll({
      factory: () => this.refresh(),
      frequency: { interval: 5000, backoff: true, max: 60 * 1000 },
      standby: 'when-hidden',
      name: 'cortex-nb:compare'
    });
    this.render();
  }

  /** Each job's record; stops once all have ended (finished trainings do not change). */
  async refresh(): Promise<void> {
    try {
      this.jobs = await Promise.all(this.jobIds.map(jobId => this._api.getJob(jobId)));
      this._error = null;
    } catch (error) {
      this._error = error instanceof CortexApiError ? `${error.code}: ${error.message}` : String(error);
      this.render();
      throw error;
    }
    this.title.label = `Compare ${this.jobs.map(job => jobTitle(job)).join(' · ')}`;
    this.render();
    if (this.jobs.every(job => isTerminal(job.status))) {
      void this._poll.stop();
    }
  }

  render(): void {
    if (!this.jobs.length) {
      replaceChildren(this._body, h('div', { class: 'cortex-muted' }, this._error ?? 'loading…'));
      return;
    }
    const rows = this.jobs.map(compareRow);
    const differing = differingColumns(rows);
    const columns = [...COLUMNS.filter(([key]) => differing.includes(key)), ...COLUMNS.filter(([key]) => !differing.includes(key))];
    replaceChildren(
      this._body,
      h('h2', {}, 'Compare trainings'),
      lossChart(this.jobs.map(job => ({ label: jobTitle(job), progress: job.progress })), { width: 640, height: 240 }),
      h('table', { class: 'cortex-table cortex-compare-table' },
        h('thead', {}, h('tr', {}, h('th', {}, 'training'), ...columns.map(([key, label]) =>
          h('th', { class: differing.includes(key) ? 'cortex-differs' : '' }, label)))),
        h('tbody', {}, ...rows.map((row, index) =>
          h('tr', { 'data-job-id': row.jobId },
            h('td', {},
              h('span', { class: `cortex-swatch ${SERIES_CLASSES[index % SERIES_CLASSES.length]}` }),
              `${row.title}`),
            ...columns.map(([key, , cell]) => h('td', { 'data-column': key }, cell(row)))
          )
        ))
      ),
      this._error ? h('div', { class: 'cortex-error' }, this._error) : null
    );
  }

  refreshNow(): Promise<void> {
    return this._poll.refresh();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._poll.dispose();
    super.dispose();
  }
}

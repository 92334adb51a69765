/**
 * One job in the main area: header with status and Cancel, a metrics chart, checkpoints, and logs that
 * follow the job (long-polled through the proxy) until it ends.
 */
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { CortexApi, CortexApiError } from '../api';
import { lineChart } from '../charts/linechart';
import { h, replaceChildren, statusBadge } from '../dom';
import { LogBuffer, MetricSeries, formatAge, formatBytes, isTerminal, sortCheckpoints } from '../model';
import { RouteUnavailableError, hasRoute } from '../routes';
import { ICheckpoint, IJob } from '../types';

/** Seconds one log long-poll may wait on the backend (it caps waits at 60). */
const LOG_WAIT_S = 20;

export class JobView extends Widget {
  readonly logs = new LogBuffer(5000);
  readonly metrics = new MetricSeries(2000);
  job: IJob | null = null;
  private _checkpoints: ICheckpoint[] | null = null;
  private _gpuReason: string | null = null;
  private _notice: string | null = null;
  private _poll: Poll;
  private _abort = new AbortController();
  private _header = h('div', { class: 'cortex-job-header' });
  private _charts = h('div', { class: 'cortex-job-charts' });
  private _checkpointsNode = h('div', { class: 'cortex-job-checkpoints' });
  private _logNode = h('pre', { class: 'cortex-log', 'aria-live': 'polite' });
  private _follow = true;

  constructor(
    private readonly _api: CortexApi,
    readonly jobId: string
  ) {
    super();
    this.addClass('cortex-job-view');
    this.id = `cortex-job-${jobId}`;
    this.title.label = `Job ${jobId}`;
    this.title.caption = `cortex-nb job ${jobId}`;
    this.title.closable = true;
    const logHead = h('div', { class: 'cortex-log-head' }, h('h3', {}, 'Logs'));
    this.node.append(
      this._header,
      h('section', { class: 'cortex-section' }, h('h3', {}, 'Metrics'), this._charts),
      h('section', { class: 'cortex-section' }, h('h3', {}, 'Checkpoints'), this._checkpointsNode),
      h('section', { class: 'cortex-section cortex-log-section' }, logHead, this._logNode)
    );
    this._logNode.addEventListener('scroll', () => {
      const node = this._logNode;
      this._follow = node.scrollTop + node.clientHeight >= node.scrollHeight - 8;
    });
    this._poll = new Poll({
      factory: () => this.refresh(),
      frequency: { interval: 2000, backoff: true, max: 30 * 1000 },
      standby: 'when-hidden',
      name: `cortex-nb:job:${jobId}`
    });
    void this._followLogs();
  }

  /** Job, metrics and checkpoints; the poll stops once the job has ended and one last round ran. */
  async refresh(): Promise<void> {
    try {
      this.job = await this._api.getJob(this.jobId);
      this._notice = null;
    } catch (error) {
      this._notice = error instanceof CortexApiError ? `${error.code}: ${error.message}` : String(error);
      this.renderHeader();
      throw error;
    }
    await Promise.all([this._refreshMetrics(), this._refreshCheckpoints()]);
    this.renderHeader();
    this.renderCharts();
    this.renderCheckpoints();
    if (isTerminal(this.job.status)) {
      void this._poll.stop();
    }
  }

  async cancel(): Promise<void> {
    try {
      this.job = await this._api.cancelJob(this.jobId);
      this._notice = null;
    } catch (error) {
      this._notice = error instanceof CortexApiError ? `${error.code}: ${error.message}` : String(error);
    }
    this.renderHeader();
    void this._poll.refresh();
  }

  private async _refreshMetrics(): Promise<void> {
    if (!hasRoute('job_metrics')) {
      return;
    }
    try {
      const page = await this._api.jobMetrics(this.jobId, this.metrics.since);
      this.metrics.append(page.samples, page.next_since);
      this._gpuReason = page.gpu_unavailable_reason ?? null;
    } catch (error) {
      if (!(error instanceof CortexApiError || error instanceof RouteUnavailableError)) {
        throw error;
      }
    }
  }

  private async _refreshCheckpoints(): Promise<void> {
    if (!hasRoute('list_checkpoints')) {
      return;
    }
    try {
      this._checkpoints = sortCheckpoints(await this._api.checkpoints(this.jobId));
    } catch (error) {
      if (!(error instanceof CortexApiError)) {
        throw error;
      }
    }
  }

  /** Long-poll the logs: each call returns as soon as lines arrive, or after LOG_WAIT_S. */
  private async _followLogs(): Promise<void> {
    let delay = 500;
    while (!this.isDisposed) {
      const ended = this.job !== null && isTerminal(this.job.status);
      try {
        const page = await this._api.logs(this.jobId, this.logs.cursor, ended ? 0 : LOG_WAIT_S, this._abort.signal);
        const fresh = this.logs.append(page.lines, page.cursor, page.dropped ?? 0);
        this.appendLogLines(fresh.map(line => line.line));
        delay = 500;
        if ((ended || isTerminal(page.job_status ?? '')) && !page.lines.length) {
          if (!this.job || !isTerminal(this.job.status)) {
            void this._poll.refresh();
          }
          return;  // the job has ended and every line has arrived
        }
      } catch (error) {
        if (this.isDisposed || (error as Error)?.name === 'AbortError') {
          return;
        }
        await new Promise(resolve => setTimeout(resolve, delay));
        delay = Math.min(delay * 2, 15000);
      }
    }
  }

  appendLogLines(lines: string[]): void {
    if (!lines.length) {
      return;
    }
    const text = document.createTextNode(lines.join('\n') + '\n');
    this._logNode.appendChild(text);
    // Keep the DOM bounded like the buffer: drop the oldest text nodes.
    while (this._logNode.childNodes.length > 500) {
      this._logNode.removeChild(this._logNode.firstChild!);
    }
    if (this._follow) {
      this._logNode.scrollTop = this._logNode.scrollHeight;
    }
  }

  renderHeader(): void {
    const job = this.job;
    const cancel = h('button', { class: 'jp-Button cortex-button cortex-cancel', disabled: !job || isTerminal(job.status) }, 'Cancel');
    cancel.addEventListener('click', () => {
      cancel.disabled = true;
      void this.cancel();
    });
    const meta = job
      ? [
          Array.from(new Set(job.sub_jobs.map(sub => `${sub.type} on ${sub.base_model}${sub.device ? ` (${sub.device})` : ''}`))).join(', '),
          `created ${formatAge(job.created_at, Date.now() / 1000)} ago`,
          job.owner ? `owner ${job.owner}` : ''
        ].filter(Boolean).join(' · ')
      : 'loading…';
    replaceChildren(
      this._header,
      h('div', { class: 'cortex-job-title-line' },
        h('h2', {}, job?.name || this.jobId),
        job ? statusBadge(job.status) : null,
        cancel
      ),
      h('div', { class: 'cortex-muted' }, `${this.jobId} · ${meta}`),
      job?.failure_code ? h('div', { class: 'cortex-error' }, `${job.failure_code}: ${job.failure_message ?? ''}`) : null,
      this._notice ? h('div', { class: 'cortex-error' }, this._notice) : null
    );
  }

  renderCharts(): void {
    if (!hasRoute('job_metrics')) {
      replaceChildren(this._charts, h('div', { class: 'cortex-muted' }, 'This backend does not serve job metrics yet.'));
      return;
    }
    const metrics = this.metrics;
    const percent = { yRange: [0, 100] as [number, number], unit: '%' };
    const charts = metrics.hasGpu
      ? [
          lineChart([{ label: 'GPU util %', points: metrics.points('gpu_utilization_percent'), className: 'cortex-series-1' }],
            { title: 'GPU utilisation', ...percent }),
          lineChart([{ label: 'GPU memory', points: metrics.points('gpu_memory_used_bytes'), className: 'cortex-series-2' }],
            { title: 'GPU memory', format: formatBytes })
        ]
      : [
          lineChart([{ label: 'CPU %', points: metrics.points('cpu_percent'), className: 'cortex-series-1' }],
            { title: 'CPU', ...percent }),
          lineChart([{ label: 'RAM', points: metrics.points('ram_used_bytes'), className: 'cortex-series-2' }],
            { title: 'RAM', format: formatBytes })
        ];
    replaceChildren(
      this._charts,
      ...charts,
      this._gpuReason ? h('div', { class: 'cortex-muted' }, `No GPU metrics: ${this._gpuReason}`) : null
    );
  }

  renderCheckpoints(): void {
    if (!hasRoute('list_checkpoints')) {
      replaceChildren(this._checkpointsNode, h('div', { class: 'cortex-muted' }, 'This backend does not list checkpoints yet.'));
      return;
    }
    const checkpoints = this._checkpoints ?? [];
    if (!checkpoints.length) {
      replaceChildren(this._checkpointsNode, h('div', { class: 'cortex-muted' }, 'no checkpoints'));
      return;
    }
    const now = Date.now() / 1000;
    replaceChildren(
      this._checkpointsNode,
      h('table', { class: 'cortex-table' },
        h('thead', {}, h('tr', {}, h('th', {}, 'checkpoint'), h('th', {}, 'type'), h('th', {}, 'step'), h('th', {}, 'size'), h('th', {}, 'age'))),
        h('tbody', {}, ...checkpoints.map(c =>
          h('tr', { 'data-checkpoint-id': c.checkpoint_id },
            h('td', {}, c.checkpoint_id), h('td', {}, c.type), h('td', {}, c.step === null ? '–' : String(c.step)),
            h('td', {}, formatBytes(c.size_bytes)), h('td', {}, formatAge(c.created_at, now))
          )
        ))
      )
    );
  }

  /** Fetch again now (the "Cortex: Refresh" command). */
  refreshNow(): Promise<void> {
    return this._poll.refresh();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._abort.abort();
    this._poll.dispose();
    super.dispose();
  }
}

/**
 * One job in the main area: its word and why it waits or when it frees its device, Cancel or (on a
 * finished training) Free device, the training's progress bar and loss chart from the backend's progress
 * record, the latest samples, device metrics, checkpoints, and logs that follow the job until it ends.
 *
 * The progress record and the logs are long-polled (`after_progress`, `wait`), at most one request each
 * per two seconds while training and one per wait while nothing changes; metrics and checkpoints
 * refresh on a slower poll.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { CortexApi, CortexApiError } from '../api';
import { lineChart } from '../charts/linechart';
import { lossChart } from '../charts/losschart';
import { displayState } from '../contract';
import { h, replaceChildren, wordBadge } from '../dom';
import { formatAge, formatBytes, formatLoss } from '../format';
import { deviceSecondsText, mismatchPoints, mismatchTitle } from '../jobfigures';
import { CANCEL_CHOICES, isTerminal, jobActions, jobLabel, jobProgress, jobTitle } from '../jobrows';
import { LogBuffer, MetricSeries, gpuMetricsNote, sortCheckpoints } from '../model';
import { RouteUnavailableError, hasRoute } from '../routes';
import { ICheckpointView, IJobView } from '../types';

/** Seconds one log long-poll may wait on the backend (it caps waits at 60). */
const LOG_WAIT_S = 20;
/** Seconds one progress long-poll may wait. */
const PROGRESS_WAIT_S = 20;
/**
 * The least time between two progress or log fetches: a long-poll answers as soon as anything is new,
 * and a training makes something new every step, so without a floor the view would fetch once per step
 * (one per log line). Two seconds batches them and still reads as live.
 */
const MIN_FETCH_INTERVAL_MS = 2000;

export class JobView extends Widget {
  readonly logs = new LogBuffer(5000);
  readonly metrics = new MetricSeries(2000);
  job: IJobView | null = null;
  private _checkpoints: ICheckpointView[] | null = null;
  private _checkpointSeen: string | null = null;
  private _gpuNote: string | null = null;
  private _notice: string | null = null;
  private _error: string | null = null;
  private _busy = false;
  private _watch: Poll;
  private _slow: Poll;
  private _ticker: number;
  private _abort = new AbortController();
  private _header = h('div', { class: 'cortex-job-header' });
  private _training = h('section', { class: 'cortex-section cortex-job-training-section' });
  private _charts = h('div', { class: 'cortex-job-charts' });
  private _checkpointsNode = h('div', { class: 'cortex-job-checkpoints' });
  private _logNode = h('pre', { class: 'cortex-log', 'aria-live': 'polite' });
  private _follow = true;
  // Where the view itself last scrolled the log to: the scroll event that follows says nothing about the
  // user (the layout may have changed in between, so it could read as "scrolled up").
  private _ownScrollTop = -1;
  // The log box changes size without a scroll event (the sections above it fill in, the tab is shown
  // again): a log being followed is kept scrolled to its end through that.
  private _logResize = typeof ResizeObserver === 'undefined' ? null : new ResizeObserver(() => this._keepLogAtEnd());

  constructor(
    private readonly _api: CortexApi,
    readonly jobId: string
  ) {
    super();
    this.addClass('cortex-job-view');
    this.id = `cortex-job-${jobId}`;
    this.title.label = jobId;
    this.title.caption = `cortex-nb job ${jobId}`;
    this.title.closable = true;
    const logHead = h('div', { class: 'cortex-log-head' }, h('h3', {}, 'Logs'));
    this._training.hidden = true;
    this.node.append(
      this._header,
      this._training,
      h('section', { class: 'cortex-section' }, h('h3', {}, 'Device'), this._charts),
      h('section', { class: 'cortex-section' }, h('h3', {}, 'Checkpoints'), this._checkpointsNode),
      h('section', { class: 'cortex-section cortex-log-section' }, logHead, this._logNode)
    );
    this._logNode.addEventListener('scroll', () => {
      const node = this._logNode;
      if (Math.abs(node.scrollTop - this._ownScrollTop) <= 1) {
        return;
      }
      this._follow = node.scrollTop + node.clientHeight >= node.scrollHeight - 8;
    });
    this._logResize?.observe(this._logNode);
    this._watch = new Poll({
      factory: () => this.watchOnce(),
      frequency: { interval: MIN_FETCH_INTERVAL_MS, backoff: true, max: 30 * 1000 },
      standby: 'when-hidden',
      name: `cortex-nb:job:${jobId}`
    });
    this._slow = new Poll({
      factory: () => this.refreshSlow(),
      frequency: { interval: 5000, backoff: true, max: 60 * 1000 },
      standby: 'when-hidden',
      name: `cortex-nb:job-metrics:${jobId}`
    });
    // The idle and keep-alive countdowns move on between updates.
    this._ticker = window.setInterval(() => {
      if (this.isVisible && this.job && !isTerminal(this.job.status) && (this.job.idle || this.job.keep_alive_until)) {
        this.renderHeader();
      }
    }, 1000);
    this.renderHeader();
    void this._followLogs();
  }

  /**
   * One round of the progress watch: the job now (first round) or once its progress record or status
   * changes; stops once the job has ended.
   */
  async watchOnce(): Promise<void> {
    const before = this.job;
    try {
      this.job = before && !isTerminal(before.status)
        ? await this._api.waitForJob(this.jobId, before.progress?.updated_at ?? 0, before.status, PROGRESS_WAIT_S,
          this._abort.signal)
        : await this._api.getJob(this.jobId);
      this._error = null;
    } catch (error) {
      if (this.isDisposed || (error as Error)?.name === 'AbortError') {
        return;
      }
      this._error = error instanceof CortexApiError ? `${error.code}: ${error.message}` : String(error);
      this.renderHeader();
      throw error;  // back off
    }
    const job = this.job;
    this.title.label = jobLabel(job);
    this.title.caption = `cortex-nb job ${jobLabel(job)}`;
    this.renderHeader();
    this.renderTraining();
    const checkpoint = `${job.status}|${job.progress?.last_checkpoint ?? ''}`;
    if (checkpoint !== this._checkpointSeen) {
      this._checkpointSeen = checkpoint;
      void this._slow.refresh();
    }
    if (isTerminal(job.status)) {
      void this._watch.stop();
    }
  }

  /** Metrics and checkpoints: every few seconds while the job runs, once more after it ends. */
  async refreshSlow(): Promise<void> {
    await Promise.all([this._refreshMetrics(), this._refreshCheckpoints()]);
    this.renderCharts();
    this.renderCheckpoints();
    if (this.job && isTerminal(this.job.status)) {
      void this._slow.stop();
    }
  }

  /**
   * Cancel, asking first when trained steps would be lost, with the cell widget's three choices: keep
   * training, stop and save (complete: the adapter kept as checkpoint "final"), or cancel and discard.
   */
  async cancel(): Promise<void> {
    const actions = this.job ? jobActions(this.job) : null;
    const warning = actions?.cancelWarning ?? null;
    if (warning) {
      const buttons = [Dialog.cancelButton({ label: CANCEL_CHOICES.keep })];
      if (actions?.stopAndSave) {
        buttons.push(Dialog.okButton({ label: CANCEL_CHOICES.stopAndSave, className: 'cortex-stop-and-save' }));
      }
      buttons.push(Dialog.warnButton({ label: CANCEL_CHOICES.discard }));
      const answer = await showDialog({
        title: `Cancel ${this.job ? jobTitle(this.job) : this.jobId}?`,
        body: warning,
        buttons
      });
      if (!answer.button.accept) {
        return;
      }
      if (answer.button.label === CANCEL_CHOICES.stopAndSave) {
        await this.stopAndSave();
        return;
      }
    }
    await this._act(async () => {
      this.job = await this._api.cancelJob(this.jobId);
      this._notice = null;
    });
  }

  /** Stop after the step in hand and keep the adapter: complete the job (checkpoint "final" first). */
  async stopAndSave(): Promise<void> {
    await this._act(async () => {
      const completed = await this._api.completeJob(this.jobId);
      this.job = completed;
      this._notice = completed.saved_checkpoint
        ? `Stopped; the trained adapter is saved as checkpoint ${completed.saved_checkpoint}.`
        : 'Stopped; every trained step was already saved.';
    });
  }

  /** Save a resumable checkpoint now; training goes on. */
  async saveCheckpoint(): Promise<void> {
    await this._act(async () => {
      const saved = await this._api.saveCheckpoint(this.jobId);
      if (saved.status !== 'succeeded') {
        throw new CortexApiError(0, saved.error?.code ?? saved.status, saved.error?.message ?? `save ${saved.status}`);
      }
      this._notice = `Saved checkpoint ${String(saved.result?.checkpoint_id ?? '')}.`;
    });
  }

  /** Complete the job: the backend saves a trained adapter as checkpoint `final` first, then frees the device. */
  async freeDevice(): Promise<void> {
    await this._act(async () => {
      const completed = await this._api.completeJob(this.jobId);
      this.job = completed;
      this._notice = completed.saved_checkpoint
        ? `Device freed; the trained adapter was saved first as checkpoint ${completed.saved_checkpoint}.`
        : 'Device freed.';
    });
  }

  private async _act(action: () => Promise<void>): Promise<void> {
    this._busy = true;
    this.renderHeader();
    try {
      await action();
      this._error = null;
    } catch (error) {
      this._error = error instanceof CortexApiError ? `${error.code}: ${error.message}` : String(error);
    }
    this._busy = false;
    this.renderHeader();
    this.renderTraining();
    void this._watch.refresh();
    void this._slow.refresh();
  }

  private async _refreshMetrics(): Promise<void> {
    if (!hasRoute('job_metrics')) {
      return;
    }
    try {
      const page = await this._api.jobMetrics(this.jobId, this.metrics.since);
      this.metrics.append(page.samples, page.next_since);
      this._gpuNote = gpuMetricsNote(page);
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
    let last = 0;
    while (!this.isDisposed) {
      const ended = this.job !== null && isTerminal(this.job.status);
      const wait = last + MIN_FETCH_INTERVAL_MS - Date.now();
      if (wait > 0 && !ended) {
        await new Promise(resolve => setTimeout(resolve, wait));
      }
      last = Date.now();
      try {
        const page = await this._api.logs(this.jobId, this.logs.cursor, ended ? 0 : LOG_WAIT_S, this._abort.signal);
        const fresh = this.logs.append(page.lines, page.cursor, page.dropped ?? 0);
        this.appendLogLines(fresh.map(line => line.line));
        delay = 500;
        if ((ended || isTerminal(page.job_status ?? '')) && !page.lines.length) {
          if (!this.job || !isTerminal(this.job.status)) {
            void this._watch.refresh();
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
    this._keepLogAtEnd();
  }

  private _keepLogAtEnd(): void {
    if (this._follow) {
      this._logNode.scrollTop = this._logNode.scrollHeight;
      this._ownScrollTop = this._logNode.scrollTop;
    }
  }

  renderHeader(): void {
    const job = this.job;
    const [word, detail] = job ? displayState(job, Date.now() / 1000) : ['', null];
    const actions = job ? jobActions(job) : null;
    const buttons: HTMLElement[] = [];
    if (actions?.freeDevice) {
      const free = h('button', {
        class: 'jp-Button cortex-button cortex-free-device', disabled: this._busy,
        title: 'Stop the job and free its device; a trained adapter is saved as checkpoint "final" first'
      }, 'Free device');
      free.addEventListener('click', () => void this.freeDevice());
      buttons.push(free);
    }
    if (actions?.saveCheckpoint) {
      const save = h('button', {
        class: 'jp-Button cortex-button cortex-save-checkpoint', disabled: this._busy,
        title: 'Save a resumable checkpoint now; training goes on'
      }, 'Save checkpoint');
      save.addEventListener('click', () => void this.saveCheckpoint());
      buttons.push(save);
    }
    if (actions?.stopAndSave) {
      const stop = h('button', {
        class: 'jp-Button cortex-button cortex-stop-and-save', disabled: this._busy,
        title: 'Stop after the step in hand and keep the adapter (checkpoint "final"), freeing the device'
      }, 'Stop and save');
      stop.addEventListener('click', () => void this.stopAndSave());
      buttons.push(stop);
    }
    if (actions?.cancel) {
      const cancel = h('button', {
        class: 'jp-Button cortex-button cortex-cancel', disabled: this._busy,
        title: 'Stop now; nothing since the last checkpoint is kept'
      }, 'Cancel');
      cancel.addEventListener('click', () => void this.cancel());
      buttons.push(cancel);
    }
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
        h('h2', {}, job ? jobTitle(job) : this.jobId),
        job ? wordBadge(word) : null,
        h('span', { class: 'cortex-job-actions' }, ...buttons)
      ),
      detail ? h('div', { class: `cortex-job-detail${word === 'failed' ? ' cortex-error' : ''}` }, detail) : null,
      h('div', { class: 'cortex-muted' }, `${this.jobId} · ${meta}`),
      this._notice ? h('div', { class: 'cortex-notice' }, this._notice) : null,
      this._error ? h('div', { class: 'cortex-error' }, this._error) : null
    );
  }

  /**
   * Progress bar, the losses as the backend names them, device-seconds used (of a budget), the loss chart,
   * the sampler ↔ trainer mismatch chart where an RL loss reports it, and the latest samples.
   */
  renderTraining(): void {
    const job = this.job;
    const record = job?.progress ?? null;
    const trains = !!job && (record !== null || job.sub_jobs.some(sub => sub.type === 'training'));
    this._training.hidden = !trains;
    if (!job || !trains) {
      return;
    }
    const progress = jobProgress(job);
    const bar = h('progress', { class: 'cortex-progress', max: 1, value: progress.fraction ?? 0 });
    if (progress.fraction === null) {
      bar.removeAttribute('value');  // indeterminate: a loop of unknown length
    }
    const figures = record
      ? [
          record.loss_per_token !== null ? `loss per token ${formatLoss(record.loss_per_token)}` : '',
          record.summed_loss !== null ? `summed loss ${formatLoss(record.summed_loss)}` : '',
          record.eval_loss_per_token !== null
            ? `eval loss per token ${formatLoss(record.eval_loss_per_token)} (step ${record.eval_step})` : '',
          record.last_checkpoint ? `last checkpoint ${record.last_checkpoint}` : ''
        ].filter(Boolean).join(' · ')
      : '';
    const deviceSeconds = deviceSecondsText(job);
    const mismatch = mismatchPoints(record);
    const samples = record?.samples;
    replaceChildren(
      this._training,
      h('h3', {}, 'Training'),
      h('div', { class: 'cortex-progress-line' },
        record ? bar : null,
        h('span', { class: 'cortex-progress-label' },
          record ? [progress.label, progress.timing].filter(Boolean).join(' · ') : 'waiting for the first step')
      ),
      figures ? h('div', { class: 'cortex-muted cortex-loss-figures' }, figures) : null,
      deviceSeconds ? h('div', { class: 'cortex-muted cortex-device-seconds' }, deviceSeconds) : null,
      h('div', { class: 'cortex-job-charts' },
        lossChart([{ label: jobTitle(job), progress: record }]),
        mismatch.length
          ? h('div', { class: 'cortex-mismatch-chart' }, lineChart(
            [{ label: 'mean |Δ logprob|', points: mismatch, className: 'cortex-series-3' }],
            { title: mismatchTitle(record), format: formatLoss, xLabel: 'step' }))
          : null),
      samples && samples.items.length
        ? h('details', { class: 'cortex-samples', open: true },
            h('summary', {}, `samples at step ${samples.step}`),
            ...samples.items.map(item =>
              h('div', { class: 'cortex-sample' }, h('span', { class: 'cortex-muted' }, item.prompt), item.text)))
        : null
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
          lineChart([
            { label: 'host CPU %', points: metrics.points('cpu_percent'), className: 'cortex-series-1' },
            { label: 'job CPU %', points: metrics.points('job_cpu_percent'), className: 'cortex-series-2' }
          ], { title: 'CPU', ...percent }),
          lineChart([
            { label: 'host RAM', points: metrics.points('ram_used_bytes'), className: 'cortex-series-1' },
            { label: 'job RAM', points: metrics.points('job_ram_bytes'), className: 'cortex-series-2' }
          ], { title: 'RAM', format: formatBytes })
        ];
    replaceChildren(
      this._charts,
      ...charts,
      this._gpuNote ? h('div', { class: 'cortex-muted cortex-gpu-reason' }, this._gpuNote) : null
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
    void this._slow.refresh();
    return this._watch.refresh();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    window.clearInterval(this._ticker);
    this._abort.abort();
    this._logResize?.disconnect();
    this._watch.dispose();
    this._slow.dispose();
    super.dispose();
  }
}

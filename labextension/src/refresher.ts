/**
 * Keeps the sidebar's model fresh with one `Poll`: backs off while the server or backend fails, and
 * stands by while the page is hidden. Every job's progress, queue place and idle countdown come with
 * the job list (the backend's own records), so a round costs the same however many jobs run.
 */
import { Poll } from '@lumino/polling';

import { CortexApi, CortexApiError } from './api';
import { PanelModel, gpuMetricsNote, noLocalBackend } from './model';
import { hasRoute } from './routes';
import { IMetricSample } from './types';

/** How many recent host samples the sidebar keeps (it shows the latest per device). */
const HOST_SAMPLES_KEPT = 200;

export class PanelRefresher {
  readonly poll: Poll;
  private _hostSince: number | null = null;

  constructor(
    private readonly _api: CortexApi,
    private readonly _model: PanelModel,
    interval = 3000
  ) {
    this.poll = new Poll({
      factory: () => this.refreshOnce(),
      frequency: { interval, backoff: true, max: 60 * 1000 },
      standby: 'when-hidden',
      name: 'cortex-nb:sidebar'
    });
  }

  /** Refresh now (the "Cortex: Refresh" command). */
  refresh(): Promise<void> {
    return this.poll.refresh();
  }

  dispose(): void {
    this.poll.dispose();
  }

  /** "Start local backend": the server starts it (or finds it started); then refresh at once. */
  async startLocalBackend(): Promise<void> {
    this._model.update({ startingLocal: true, startError: null });
    try {
      await this._api.startLocalBackend();
      this._model.update({ startingLocal: false });
    } catch (error) {
      const message = error instanceof CortexApiError ? `${error.code}: ${error.message}` : String(error);
      this._model.update({ startingLocal: false, startError: message });
    }
    await this.refresh();
  }

  /** One round: status, then capacity, host metrics and jobs (each with its progress, queue and idle state). */
  async refreshOnce(): Promise<void> {
    const model = this._model;
    try {
      const status = await this._api.status();
      if (noLocalBackend(status) || (!status.reachable && status.source?.kind === 'local')) {
        // Not a failure to back off from: no local backend runs (or it is still starting). Checking is
        // a file read on the server, so keep the normal pace and a backend started from a notebook
        // shows here within one interval.
        model.update({ status, capacity: null, jobs: [], hostSamples: [], error: null, updatedAt: Date.now() });
        this._hostSince = null;
        return;
      }
      if (!status.reachable || !status.authenticated) {
        model.update({ status, error: null, updatedAt: Date.now() });
        throw new Error(status.error?.message ?? 'backend not available');  // back off
      }
      const [capacity, jobs, metrics] = await Promise.all([
        this._api.capacity(),
        this._api.listJobs(),
        this._hostMetrics()
      ]);
      model.update({
        status,
        capacity,
        jobs,
        hostSamples: metrics.samples,
        gpuMetricsNote: metrics.note,
        error: null,
        updatedAt: Date.now()
      });
    } catch (error) {
      const message = error instanceof CortexApiError ? `${error.code}: ${error.message}` : String(error);
      model.update({ error: message, updatedAt: Date.now() });
      throw error;  // the poll backs off
    }
  }

  private async _hostMetrics(): Promise<{ samples: IMetricSample[]; note: string | null }> {
    if (!hasRoute('host_metrics')) {
      return { samples: [], note: null };
    }
    const page = await this._api.hostMetrics(this._hostSince);
    const samples = [...this._model.state.hostSamples, ...page.samples].slice(-HOST_SAMPLES_KEPT);
    if (page.samples.length) {
      this._hostSince = page.next_since ?? page.samples[page.samples.length - 1].at;
    }
    return { samples, note: gpuMetricsNote(page) };
  }
}

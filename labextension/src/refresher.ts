/**
 * Keeps the sidebar's model fresh with one `Poll`: backs off while the server or backend fails, and
 * stands by while the page is hidden.
 */
import { Poll } from '@lumino/polling';

import { CortexApi, CortexApiError } from './api';
import { PanelModel, requestIdOf } from './model';
import { RouteUnavailableError, hasRoute } from './routes';
import { IMetricSample, IRequestSummary } from './types';

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

  /** One round: status, capacity, host metrics, jobs and the progress of active jobs. */
  async refreshOnce(): Promise<void> {
    const model = this._model;
    try {
      const status = await this._api.status();
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
        gpuUnavailableReason: metrics.reason,
        requestsByJob: await this._progress(model.activeJobIdsOf(jobs)),
        error: null,
        updatedAt: Date.now()
      });
    } catch (error) {
      const message = error instanceof CortexApiError ? `${error.code}: ${error.message}` : String(error);
      model.update({ error: message, updatedAt: Date.now() });
      throw error;  // the poll backs off
    }
  }

  private async _hostMetrics(): Promise<{ samples: IMetricSample[]; reason: string | null }> {
    if (!hasRoute('host_metrics')) {
      return { samples: [], reason: null };
    }
    const page = await this._api.hostMetrics(this._hostSince);
    const samples = [...this._model.state.hostSamples, ...page.samples].slice(-HOST_SAMPLES_KEPT);
    if (page.samples.length) {
      this._hostSince = page.next_since ?? page.samples[page.samples.length - 1].at;
    }
    return { samples, reason: page.gpu_unavailable_reason ?? null };
  }

  /**
   * For each active job, its newest finished `step` request (whose result holds the step number).
   * Best effort: a job whose progress cannot be read still shows, without a step.
   */
  private async _progress(jobIds: string[]): Promise<Record<string, IRequestSummary[]>> {
    const progress: Record<string, IRequestSummary[]> = {};
    await Promise.all(
      jobIds.slice(0, 10).map(async jobId => {
        try {
          const requests = await this._api.listRequests(jobId, 20);
          const lastStep = requests.find(r => r.op === 'step' && r.status === 'succeeded');
          const requestId = lastStep ? requestIdOf(lastStep) : null;
          if (requestId) {
            progress[jobId] = [await this._api.call<IRequestSummary>('get_request', { job_id: jobId, request_id: requestId })];
          }
        } catch (error) {
          if (!(error instanceof CortexApiError || error instanceof RouteUnavailableError)) {
            console.warn(`cortex-nb: cannot read the progress of ${jobId}`, error);
          }
        }
      })
    );
    return progress;
  }
}

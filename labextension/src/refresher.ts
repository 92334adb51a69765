/**
 * Keeps the sidebar's model fresh with one `Poll`: backs off while the server or backend fails, and
 * stands by while the page is hidden. Every job's progress, queue place and idle countdown come with
 * the job list (the backend's own records), so a round costs the same however many jobs run.
 */
import { Poll } from '@lumino/polling';

import { CortexApi, CortexApiError } from './api';
import { IPanelState, PanelModel, gpuMetricsNote, noLocalBackend } from './model';
import { IRunNotice, runNotices } from './notices';
import { hasRoute } from './routes';
import { IJobView, IMetricSample } from './types';

const WEEK_STATS_EVERY_MS = 60_000;

/** How many recent host samples the sidebar keeps (it shows the latest per device). */
const HOST_SAMPLES_KEPT = 200;

export class PanelRefresher {
  readonly poll: Poll;
  private _hostSince: number | null = null;
  /** The job list of the last round, to tell what changed since (null: nothing seen yet). */
  private _lastJobs: IJobView[] | null = null;
  // When this week's usage was last fetched: it changes slowly and scans the backend's records, so once a minute.
  private _weekStatsAt = 0;

  constructor(
    private readonly _api: CortexApi,
    private readonly _model: PanelModel,
    interval = 3000,
    /** Told when one of this user's runs ends, fails or starts waiting (the bell: see notices.ts). */
    private readonly _onNotice: (notice: IRunNotice) => void = () => undefined
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
        this._lastJobs = null;
        return;
      }
      if (!status.reachable || !status.authenticated) {
        model.update({ status, error: null, updatedAt: Date.now() });
        throw new Error(status.error?.message ?? 'backend not available');  // back off
      }
      const [capacity, jobs, metrics, storage, week] = await Promise.all([
        this._api.capacity(),
        this._api.listJobs(),
        this._hostMetrics(),
        this._storage(),
        this._weekStats(status.identity?.owner ?? null)
      ]);
      for (const notice of runNotices(this._lastJobs, jobs)) {
        this._onNotice(notice);
      }
      this._lastJobs = jobs;
      model.update({
        status,
        capacity,
        jobs,
        hostSamples: metrics.samples,
        gpuMetricsNote: metrics.note,
        ...storage,
        ...week,
        error: null,
        updatedAt: Date.now()
      });
    } catch (error) {
      const message = error instanceof CortexApiError ? `${error.code}: ${error.message}` : String(error);
      model.update({ error: message, updatedAt: Date.now() });
      throw error;  // the poll backs off
    }
  }

  /** This user's device time over the last 7 days, at most once a minute; left as it was on a refusal. */
  private async _weekStats(owner: string | null): Promise<Partial<IPanelState>> {
    const now = Date.now();
    if (!hasRoute('stats') || now - this._weekStatsAt < WEEK_STATS_EVERY_MS) {
      return {};
    }
    this._weekStatsAt = now;
    const weekStats = await this._api.stats(owner).catch(() => null);
    return weekStats ? { weekStats } : {};
  }

  /** Fetch the storage view and the open job's lineage now (after a storage action). */
  async refreshStorage(): Promise<void> {
    this._model.update(await this._storage());
  }

  /**
   * Checkpoint storage, and the lineage of the job open in the storage section. A backend without these
   * routes, or one refusing them, leaves the section empty rather than failing the round.
   */
  private async _storage(): Promise<Partial<IPanelState>> {
    if (!hasRoute('storage')) {
      return {};
    }
    const open = this._model.state.storageJob;
    const [storage, lineage] = await Promise.all([
      this._api.storage().catch(() => null),
      open && hasRoute('job_lineage') ? this._api.lineage(open).catch(() => null) : Promise.resolve(null)
    ]);
    // The job may have been closed (or another opened) while the answers came.
    const still = this._model.state.storageJob === open;
    return still ? { storage, lineage } : { storage };
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

/**
 * Calls to the Jupyter server extension: `{baseUrl}cortex/api/status` and the proxied backend routes
 * `{baseUrl}cortex/api/<backend path>`. Jupyter adds its auth and XSRF headers; the backend token never
 * reaches the browser.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { REQUEST_TERMINAL } from './contract';
import { QueryValue, routePath } from './routes';
import { ICapacity, ICheckpointView, ICompletedJob, IDeletedJob, IExtensionStatus, IHostMetrics, IJobLineage, IJobLogPage, IJobMetrics, IJobView, IPrunedCheckpoints, IRequestStatus, IRequestSummary, IRouteReplies, IStats, IStorageView, JsonRouteName } from './types';

export const API_PATH = 'cortex/api';

/** A refusal or failure, with the backend's (or the extension's) stable error code. */
export class CortexApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly detail: Record<string, unknown> = {}
  ) {
    super(message);
    this.name = 'CortexApiError';
  }
}

export class CortexApi {
  constructor(readonly settings: ServerConnection.ISettings = ServerConnection.makeSettings()) {}

  /** Absolute URL of a path under the extension's mount point. */
  url(path: string): string {
    return URLExt.join(this.settings.baseUrl, API_PATH, path);
  }

  async request<T>(method: string, path: string, body?: unknown, signal?: AbortSignal): Promise<T> {
    const init: RequestInit = { method, signal };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers = { 'Content-Type': 'application/json' };
    }
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(this.url(path), init, this.settings);
    } catch (error) {
      if ((error as Error)?.name === 'AbortError') {
        throw error;
      }
      throw new CortexApiError(0, 'jupyter_unreachable', `cannot reach the Jupyter server: ${error}`);
    }
    const text = await response.text();
    let data: any = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch {
      data = null;
    }
    if (!response.ok) {
      const error = data?.error;
      if (error && typeof error.code === 'string') {
        throw new CortexApiError(response.status, error.code, error.message ?? '', error.detail ?? {});
      }
      throw new CortexApiError(
        response.status,
        response.status === 404 ? 'extension_missing' : 'http_error',
        response.status === 404
          ? 'the cortex-nb server extension is not enabled on this Jupyter server'
          : `HTTP ${response.status} ${response.statusText}`
      );
    }
    return data as T;
  }

  /** Call a backend route by its name in the route table; the answer has the route's reply type. */
  call<N extends JsonRouteName>(
    name: N,
    params: Record<string, string> = {},
    query: Record<string, QueryValue> = {},
    body?: unknown,
    signal?: AbortSignal
  ): Promise<IRouteReplies[N]> {
    const { method, path } = routePath(name, params, query);
    return this.request<IRouteReplies[N]>(method, path, body, signal);
  }

  status(): Promise<IExtensionStatus> {
    return this.request<IExtensionStatus>('GET', 'status');
  }

  /** Start the user's local backend (only when the server has no backend configured); answers the status. */
  startLocalBackend(): Promise<IExtensionStatus> {
    return this.request<IExtensionStatus>('POST', 'local/start', {});
  }

  capacity(): Promise<ICapacity> {
    return this.call('capacity');
  }

  hostMetrics(since: number | null): Promise<IHostMetrics> {
    return this.call('host_metrics', {}, { since });
  }

  async listJobs(limit = 50): Promise<IJobView[]> {
    return (await this.call('list_jobs', {}, { limit })).jobs;
  }

  getJob(jobId: string): Promise<IJobView> {
    return this.call('get_job', { job_id: jobId });
  }

  /**
   * The job once its progress record is newer than `afterProgress` or its status leaves `whileStatus`,
   * or after `waitS` (a long-poll: about one request per update, not one per step).
   */
  waitForJob(jobId: string, afterProgress: number, whileStatus: string, waitS: number, signal?: AbortSignal): Promise<IJobView> {
    return this.call('get_job', { job_id: jobId },
      { wait: waitS, after_progress: afterProgress, while_status: whileStatus }, undefined, signal);
  }

  cancelJob(jobId: string): Promise<IJobView> {
    return this.call('cancel_job', { job_id: jobId }, {}, {});
  }

  /** "Free device": complete the job; the backend saves a trained adapter as checkpoint `final` first. */
  completeJob(jobId: string): Promise<ICompletedJob> {
    return this.call('complete_job', { job_id: jobId }, {}, {});
  }

  /** "Save checkpoint": a resumable checkpoint of the trainer now; answers once it is saved. */
  async saveCheckpoint(jobId: string, timeoutS = 300): Promise<IRequestStatus> {
    const submitted = await this.call('save', { job_id: jobId }, {}, { type: 'resumable' });
    const deadline = Date.now() + timeoutS * 1000;
    for (;;) {
      const status = await this.call('get_request', { job_id: jobId, request_id: submitted.request_id }, { wait: 10 });
      if (REQUEST_TERMINAL.includes(status.status)) {
        return status;
      }
      if (Date.now() > deadline) {
        throw new CortexApiError(0, 'timeout', `the save of ${jobId} is still ${status.status}; it keeps going`);
      }
    }
  }

  async listRequests(jobId: string, limit = 50): Promise<IRequestSummary[]> {
    return (await this.call('list_requests', { job_id: jobId }, { limit })).requests;
  }

  /** Log lines after `cursor`; with `waitS` the backend holds the call until lines arrive (long-poll). */
  logs(jobId: string, cursor: number, waitS = 0, signal?: AbortSignal): Promise<IJobLogPage> {
    return this.call('job_logs', { job_id: jobId }, { cursor, wait: waitS || undefined, limit: 1000 }, undefined, signal);
  }

  jobMetrics(jobId: string, since: number | null): Promise<IJobMetrics> {
    return this.call('job_metrics', { job_id: jobId }, { since });
  }

  async checkpoints(jobId: string): Promise<ICheckpointView[]> {
    return (await this.call('list_checkpoints', { job_id: jobId })).checkpoints;
  }

  /** Rename a job, or replace its labels (tags) whole. */
  updateJob(jobId: string, change: { name?: string; labels?: Record<string, string> }): Promise<IJobView> {
    return this.call('update_job', { job_id: jobId }, {}, change);
  }

  /** Forget a finished job with its logs and checkpoints (refused while it runs or keeps a checkpoint). */
  deleteJob(jobId: string): Promise<IDeletedJob> {
    return this.call('delete_job', { job_id: jobId });
  }

  /** Checkpoint bytes per owner (against the quota) and per job. */
  storage(): Promise<IStorageView> {
    return this.call('storage');
  }

  /** `GET /v1/stats` over its default window (the last 7 days), for `owner` (the token's own when null). */
  stats(owner: string | null): Promise<IStats> {
    return this.call('stats', {}, owner ? { owner } : {});
  }

  /** Job → step → checkpoint → exports, loads and samplings; the job's weight syncs. */
  lineage(jobId: string): Promise<IJobLineage> {
    return this.call('job_lineage', { job_id: jobId });
  }

  keepCheckpoint(jobId: string, checkpointId: string, kept: boolean): Promise<ICheckpointView> {
    return this.call('update_checkpoint', { job_id: jobId, checkpoint_id: checkpointId }, {}, { kept });
  }

  /** Delete a job's checkpoints but `final` and the kept ones (or only those older than); a dry run deletes nothing. */
  pruneCheckpoints(jobId: string, options: { olderThanS?: number; dryRun?: boolean } = {}): Promise<IPrunedCheckpoints> {
    const body: Record<string, unknown> = { keep_final: true, dry_run: options.dryRun ?? false };
    if (options.olderThanS !== undefined) {
      body.older_than_s = options.olderThanS;
    }
    return this.call('prune_checkpoints', { job_id: jobId }, {}, body);
  }
}

/**
 * The panel's data model: what the sidebar and job view show, computed from the backend's JSON.
 * Pure TypeScript (no JupyterLab imports), so every rule here is unit-tested with jest.
 */
import { API_VERSION, PACKAGE_VERSION } from './contract';
import { formatBytes } from './format';
import { DEFAULT_FILTER, IJobFilter, filterJobs, hiddenShortLived } from './joblist';
import { IJobRow, ITrainingSummary, finishedTrainings, isTerminal, jobRow, listedJobs } from './jobrows';
import { ICheckpointRow, IStorageJobRow, IStorageMeter, checkpointRows, storageJobRows, storageMeters } from './storage';
import {
  ICapacity,
  ICheckpointView,
  IDeviceCapacity,
  IExtensionStatus,
  IHostMetrics,
  IJobLineage,
  IJobMetrics,
  IJobView,
  ILogLine,
  IMetricSample,
  IStats,
  IStorageView
} from './types';

export function apiMajor(version: string | undefined | null): number | null {
  if (!version) {
    return null;
  }
  const major = parseInt(version.split('.')[0], 10);
  return Number.isNaN(major) ? null : major;
}

/** Plain-words warnings when the panel, the server extension and the backend disagree on versions. */
export function versionWarnings(
  status: IExtensionStatus | null,
  panel: { version: string; apiVersion: string } = { version: PACKAGE_VERSION, apiVersion: API_VERSION }
): string[] {
  if (!status) {
    return [];
  }
  const warnings: string[] = [];
  const extension = status.extension.version;
  if (extension !== panel.version) {
    warnings.push(
      `This panel is version ${panel.version} but the Jupyter server extension is ${extension}: ` +
        'reinstall cortex-nb and restart JupyterLab, then reload the page.'
    );
  }
  const backend = status.backend?.version;
  if (status.reachable && backend && backend !== extension) {
    warnings.push(
      `The backend runs cortex-nb ${backend} but this Jupyter server has ${extension}: ` +
        'install the same version on both.'
    );
  }
  const backendApi = apiMajor(status.backend?.api_version);
  if (status.reachable && backendApi !== null && backendApi !== apiMajor(panel.apiVersion)) {
    warnings.push(
      `The backend speaks API ${status.backend?.api_version} and this panel API ${panel.apiVersion}: ` +
        'most views will fail until the versions match.'
    );
  }
  return warnings;
}

export type ConnectionState = 'unknown' | 'connected' | 'unauthenticated' | 'unreachable' | 'no_local_backend' | 'error';

export function connectionState(status: IExtensionStatus | null, requestError: string | null): ConnectionState {
  if (requestError) {
    return 'error';
  }
  if (!status) {
    return 'unknown';
  }
  if (!status.reachable) {
    return noLocalBackend(status) ? 'no_local_backend' : 'unreachable';
  }
  return status.authenticated ? 'connected' : 'unauthenticated';
}

/** The one quiet line a view shows when there are no GPU metrics (older backends send only the reason). */
export function gpuMetricsNote(
  page: Partial<Pick<IHostMetrics | IJobMetrics, 'gpu_metrics_note' | 'gpu_unavailable_reason'>>
): string | null {
  if (page.gpu_metrics_note !== undefined) {
    return page.gpu_metrics_note ?? null;
  }
  return page.gpu_unavailable_reason ? `no GPU metrics: ${page.gpu_unavailable_reason}` : null;
}

/** No backend is configured and no local backend runs: the panel offers to start one. */
export function noLocalBackend(status: IExtensionStatus | null): boolean {
  return !!status && !status.reachable && status.source?.kind === 'local' && !!status.source.can_start_local &&
    status.error?.detail?.local_backend === 'not_running';
}

export interface IDeviceRow {
  id: string;
  name: string;
  kind: string;
  slotsInUse: number;
  slots: number;
  /** Sub-jobs served as slots of the device's adapter host (beside `slots` processes); 0: it hosts none. */
  adapterSlotsInUse: number;
  adapterSlots: number;
  /** 0..100 from the latest sample; null when the backend reports none for this device. */
  utilization: number | null;
  utilizationLabel: string;
  memoryUsed: number | null;
  memoryTotal: number | null;
  memoryFraction: number | null;
  memoryLabel: string;
  temperatureC: number | null;
  powerW: number | null;
  /** The sampling engine of the device's sampling sub-jobs; null when the backend does not say. */
  sampler: string | null;
}

/** One line per host when the backend's devices span several (a Ray cluster): free slots and models. */
export function hostLines(capacity: ICapacity | null): string[] {
  const hosts = capacity?.hosts ?? [];
  if (hosts.length < 2) {
    return [];
  }
  return hosts.map(host => {
    const models = host.models ? ` · ${host.models.join(', ')}` : '';
    const adapter = host.adapter_slots_total
      ? ` (+${host.adapter_slots_available}/${host.adapter_slots_total} adapter)`
      : '';
    return `${host.host}: ${host.slots_available}/${host.slots_total} slots free${adapter}${models}`;
  });
}

/**
 * One line per adapter host (a worker holding a base once for the slots on a device); the
 * same words as `%cortex capacity` (cortex_nb/views.py `adapter_host_lines`).
 */
export function adapterHostLines(capacity: ICapacity | null): string[] {
  const hosts = capacity?.executor?.adapter_hosts ?? [];
  const vllmDevices = new Set((capacity?.devices ?? []).filter(device => device.sampler === 'vllm').map(device => device.id));
  return hosts.map(
    host =>
      `adapter host ${host.device} · ${host.base_model}: ${host.slots} slot(s) on one base` +
      ` (${formatBytes(host.base_bytes)} held once; slots add ${formatBytes(host.slots_bytes)})` +
      batchedWords(host.batched_operations ?? []) +
      (vllmDevices.has(host.device) ? VLLM_HOST_WORDS : '')
  );
}

/** The end of the line of a host on a device sampling with vLLM (its sampling slots share one engine). */
const VLLM_HOST_WORDS = '; its vLLM sampling slots share one vLLM engine';

/** What a host runs for several slots in one pass (--batch-across-slots), as the end of its line. */
function batchedWords(operations: string[]): string {
  const sorted = [...operations].sort().reverse();
  return sorted.length ? `; ${sorted.join(' and ')} batched across slots` : '';
}

const HOSTING_WORDS: Record<string, string> = {
  auto: 'adapter hosts on GPUs (slots share a process and its base), a process per sub-job on CPUs',
  adapter_host: 'adapter hosts on every device (slots share a process and its base)',
  isolation_per_job: 'a process per sub-job on every device',
  // `auto` on a backend whose devices are all of one kind: only that half applies
  'auto:cpu': 'a process per sub-job',
  'auto:cuda': 'adapter hosts (slots share a process and its base)'
};

/**
 * How the executor runs sub-jobs (on Ray each process is an actor), and whether CPU workers are forks of
 * one process; none for a backend that does not say. The same words as `%cortex capacity`
 * (cortex_nb/views.py `hosting_line`).
 */
export function hostingLine(capacity: ICapacity | null): string[] {
  const executor = capacity?.executor;
  const kinds = [...new Set((capacity?.devices ?? []).map(device => device.kind))];
  const hosting = executor?.hosting === 'auto' && kinds.length === 1 ? `auto:${kinds[0]}` : executor?.hosting;
  const words = hosting ? HOSTING_WORDS[hosting] : undefined;
  if (!words) {
    return [];
  }
  return [`hosting: ${words}${executor?.fork_server ? '; CPU workers forked from one process' : ''}`];
}

/**
 * The bases held quantized ("quantized bases: llama-8b nf4"), or none; the same words as `%cortex capacity`
 * (cortex_nb/views.py `quantized_models_line`).
 */
export function quantizedModelsLine(capacity: ICapacity | null): string[] {
  const quantized = Object.entries(capacity?.quantized_models ?? {}).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return quantized.length ? [`quantized bases: ${quantized.map(([name, kind]) => `${name} ${kind}`).join(', ')}`] : [];
}

/**
 * "your device-hours this week: 1.25 h" from `GET /v1/stats` over its default 7-day window: the owner's own
 * share when the stats cover several owners (an admin token), else the total. Empty before the first fetch.
 */
export function weekUsageLine(stats: IStats | null, owner: string | null): string {
  if (!stats) {
    return '';
  }
  const seconds = owner && stats.owner === null ? stats.device_seconds.by_owner[owner] ?? 0 : stats.device_seconds.total;
  return `your device-hours this week: ${(seconds / 3600).toFixed(seconds < 36 ? 3 : 2)} h`;
}

/** The newest sample per device. */
export function latestByDevice(samples: IMetricSample[]): Map<string, IMetricSample> {
  const latest = new Map<string, IMetricSample>();
  for (const sample of samples) {
    const key = sample.device ?? '';
    const seen = latest.get(key);
    if (!seen || sample.at >= seen.at) {
      latest.set(key, sample);
    }
  }
  return latest;
}

/**
 * One row per device: GPU utilisation and memory where the sample has GPU fields, otherwise the host's
 * CPU and RAM (a CPU-only host reports no GPU fields at all, never zeros).
 */
export function deviceRows(capacity: ICapacity | null, samples: IMetricSample[]): IDeviceRow[] {
  if (!capacity) {
    return [];
  }
  const latest = latestByDevice(samples);
  const hostWide = latest.get('') ?? latest.get('host') ?? null;
  return capacity.devices.map((device: IDeviceCapacity) => {
    const sample = latest.get(device.id) ?? (device.kind === 'cpu' ? hostWide : null) ?? null;
    // A GPU shows only GPU fields; a CPU device shows the host's CPU and RAM.
    const gpu = device.kind !== 'cpu';
    const utilization = (gpu ? sample?.gpu_utilization_percent : sample?.cpu_percent) ?? null;
    const memoryUsed = (gpu ? sample?.gpu_memory_used_bytes : sample?.ram_used_bytes) ?? null;
    const memoryTotal = (gpu ? sample?.gpu_memory_total_bytes ?? device.memory_bytes : sample?.ram_total_bytes) ?? null;
    const memoryFraction = memoryUsed !== null && memoryTotal ? Math.min(1, memoryUsed / memoryTotal) : null;
    const what = gpu ? 'GPU' : 'CPU';
    const memoryName = gpu ? 'memory' : 'RAM';
    return {
      id: device.id,
      name: device.name,
      kind: device.kind,
      slotsInUse: device.slots_in_use,
      slots: device.slots,
      adapterSlotsInUse: device.adapter_slots_in_use ?? 0,
      adapterSlots: device.adapter_slots ?? 0,
      utilization,
      utilizationLabel: utilization === null ? `${what} –` : `${what} ${Math.round(utilization)}%`,
      memoryUsed,
      memoryTotal,
      memoryFraction,
      memoryLabel:
        memoryUsed === null
          ? `${memoryName} ${formatBytes(memoryTotal)}`
          : `${memoryName} ${formatBytes(memoryUsed)} / ${formatBytes(memoryTotal)}`,
      temperatureC: sample?.gpu_temperature_c ?? null,
      powerW: sample?.gpu_power_watts ?? null,
      sampler: device.sampler ?? null
    };
  });
}

/** Log lines kept in order, without duplicates, at most `capacity` of them (the newest). */
export class LogBuffer {
  private _lines: ILogLine[] = [];
  private _cursor = 0;
  private _dropped = 0;

  constructor(readonly capacity = 5000) {}

  get lines(): readonly ILogLine[] {
    return this._lines;
  }

  /** The last sequence number received: ask the backend for lines after it. */
  get cursor(): number {
    return this._cursor;
  }

  /** Lines the backend or this buffer no longer holds. */
  get dropped(): number {
    return this._dropped;
  }

  /** Add a page; returns the lines that were new. */
  append(lines: ILogLine[], cursor: number, droppedByBackend = 0): ILogLine[] {
    const fresh = lines.filter(line => line.seq > this._cursor).sort((a, b) => a.seq - b.seq);
    this._dropped += droppedByBackend;
    this._lines.push(...fresh);
    if (this._lines.length > this.capacity) {
      const excess = this._lines.length - this.capacity;
      this._lines.splice(0, excess);
      this._dropped += excess;
    }
    this._cursor = Math.max(this._cursor, cursor, ...fresh.map(line => line.seq));
    return fresh;
  }
}

export type MetricField = keyof Omit<IMetricSample, 'at' | 'device'>;

/** Metric samples over time for one job, deduplicated by (time, device) and capped. */
export class MetricSeries {
  private _samples: IMetricSample[] = [];
  private _seen = new Set<string>();
  private _since: number | null = null;

  constructor(readonly capacity = 2000) {}

  get samples(): readonly IMetricSample[] {
    return this._samples;
  }

  /** Pass as `since` on the next fetch. */
  get since(): number | null {
    return this._since;
  }

  append(samples: IMetricSample[], nextSince?: number | null): void {
    for (const sample of samples) {
      const key = `${sample.at}|${sample.device ?? ''}`;
      if (!this._seen.has(key)) {
        this._seen.add(key);
        this._samples.push(sample);
      }
    }
    this._samples.sort((a, b) => a.at - b.at);
    if (this._samples.length > this.capacity) {
      for (const dropped of this._samples.splice(0, this._samples.length - this.capacity)) {
        this._seen.delete(`${dropped.at}|${dropped.device ?? ''}`);
      }
    }
    const newest = this._samples.length ? this._samples[this._samples.length - 1].at : null;
    this._since = nextSince ?? newest ?? this._since;
  }

  /** Whether any sample carries GPU fields (otherwise charts show CPU and RAM). */
  get hasGpu(): boolean {
    return this._samples.some(sample => sample.gpu_utilization_percent !== undefined);
  }

  /** (time, value) points of one field, for one device or all. */
  points(field: MetricField, device?: string): Array<[number, number]> {
    const points: Array<[number, number]> = [];
    for (const sample of this._samples) {
      const value = sample[field];
      if (typeof value === 'number' && (device === undefined || sample.device === device)) {
        points.push([sample.at, value]);
      }
    }
    return points;
  }
}

export function sortCheckpoints(checkpoints: ICheckpointView[]): ICheckpointView[] {
  return [...checkpoints].sort((a, b) => b.created_at - a.created_at);
}

/** The sidebar's state, refreshed by the poller; views re-render on `changed`. */
export interface IPanelState {
  status: IExtensionStatus | null;
  capacity: ICapacity | null;
  hostSamples: IMetricSample[];
  /** One quiet line when the host reports no GPU metrics ("CPU host: no GPU metrics"). */
  gpuMetricsNote: string | null;
  jobs: IJobView[];
  error: string | null;
  updatedAt: number | null;
  /** "Start local backend" was clicked and the server is starting it. */
  startingLocal: boolean;
  /** Why the last start failed. */
  startError: string | null;
  /** Finished trainings ticked for comparison, in the order they were ticked. */
  compareSelection: string[];
  /** Which jobs the lists show (name, id or tag; short-lived ones hidden by default). */
  filter: IJobFilter;
  /** Checkpoint bytes per owner and job; null before the first fetch or where the backend has no such route. */
  storage: IStorageView | null;
  /** The job whose checkpoints the storage section shows, and its lineage once fetched. */
  storageJob: string | null;
  lineage: IJobLineage | null;
  /** The last storage action's outcome or refusal, shown under the storage section. */
  storageNote: string | null;
  /** This user's `GET /v1/stats` over the last 7 days; null before the first fetch or without the route. */
  weekStats: IStats | null;
}

export class PanelModel {
  private _state: IPanelState = {
    status: null,
    capacity: null,
    hostSamples: [],
    gpuMetricsNote: null,
    jobs: [],
    error: null,
    updatedAt: null,
    startingLocal: false,
    startError: null,
    compareSelection: [],
    filter: DEFAULT_FILTER,
    storage: null,
    storageJob: null,
    weekStats: null,
    lineage: null,
    storageNote: null
  };
  private _listeners = new Set<(model: PanelModel) => void>();

  get state(): Readonly<IPanelState> {
    return this._state;
  }

  update(change: Partial<IPanelState>): void {
    this._state = { ...this._state, ...change };
    for (const listener of Array.from(this._listeners)) {
      listener(this);
    }
  }

  /** Subscribe to changes; returns the function that unsubscribes. */
  onChange(listener: (model: PanelModel) => void): () => void {
    this._listeners.add(listener);
    return () => this._listeners.delete(listener);
  }

  get connection(): ConnectionState {
    return connectionState(this._state.status, this._state.error);
  }

  get warnings(): string[] {
    return versionWarnings(this._state.status);
  }

  weekUsage(): string {
    return weekUsageLine(this._state.weekStats, this._state.status?.identity?.owner ?? null);
  }

  hosts(): string[] {
    return [
      ...hostLines(this._state.capacity),
      ...hostingLine(this._state.capacity),
      ...adapterHostLines(this._state.capacity),
      ...quantizedModelsLine(this._state.capacity)
    ];
  }

  devices(): IDeviceRow[] {
    return deviceRows(this._state.capacity, this._state.hostSamples);
  }

  /** The jobs the filter lets through (short-lived ones only when asked for). */
  get filteredJobs(): IJobView[] {
    return filterJobs(this._state.jobs, this._state.filter);
  }

  /** Jobs still going, and finished jobs that never trained, as the filter lets through. */
  jobRows(nowS: number): IJobRow[] {
    return listedJobs(this.filteredJobs).map(job => jobRow(job, nowS));
  }

  finishedTrainings(nowS: number): ITrainingSummary[] {
    return finishedTrainings(this.filteredJobs, nowS);
  }

  /** Short-lived jobs (compare, sampling on demand) the filter hides. */
  get hiddenShortLived(): number {
    return hiddenShortLived(this._state.jobs, this._state.filter);
  }

  setFilter(change: Partial<IJobFilter>): void {
    this.update({ filter: { ...this._state.filter, ...change } });
  }

  storageMeters(): IStorageMeter[] {
    return storageMeters(this._state.storage);
  }

  storageJobs(): IStorageJobRow[] {
    return storageJobRows(this._state.storage);
  }

  /** The open job's checkpoints (empty until its lineage arrives, or when another job's is held). */
  storageCheckpoints(): ICheckpointRow[] {
    const lineage = this._state.lineage;
    return lineage && lineage.job_id === this._state.storageJob ? checkpointRows(lineage) : [];
  }

  /** Open a job's checkpoints in the storage section, or close them when it is open already. */
  toggleStorageJob(jobId: string): void {
    const open = this._state.storageJob === jobId ? null : jobId;
    this.update({ storageJob: open, lineage: null, storageNote: null });
  }

  /** Tick or untick a finished training for comparison. */
  toggleCompare(jobId: string): void {
    const selection = this._state.compareSelection;
    this.update({
      compareSelection: selection.includes(jobId) ? selection.filter(id => id !== jobId) : [...selection, jobId]
    });
  }

  /** Whether anything shown counts down (an idle job freeing its device, a keep-alive): re-render each second. */
  get hasCountdown(): boolean {
    return this._state.jobs.some(job => !isTerminal(job.status) && (job.idle !== null || job.keep_alive_until !== null));
  }
}

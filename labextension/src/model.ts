/**
 * The panel's data model: what the sidebar and job view show, computed from the backend's JSON.
 * Pure TypeScript (no JupyterLab imports), so every rule here is unit-tested with jest.
 */
import { API_VERSION, JOB_TERMINAL, PACKAGE_VERSION } from './contract';
import {
  ICapacity,
  ICheckpoint,
  IDevice,
  IJob,
  ILogLine,
  IMetricSample,
  IRequestSummary,
  IStatus
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
  status: IStatus | null,
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

export type ConnectionState = 'unknown' | 'connected' | 'unauthenticated' | 'unreachable' | 'error';

export function connectionState(status: IStatus | null, requestError: string | null): ConnectionState {
  if (requestError) {
    return 'error';
  }
  if (!status) {
    return 'unknown';
  }
  if (!status.reachable) {
    return 'unreachable';
  }
  return status.authenticated ? 'connected' : 'unauthenticated';
}

export function isTerminal(status: string): boolean {
  return JOB_TERMINAL.includes(status);
}

/** "12s", "5m", "3h", "2d": how long ago `thenS` (epoch seconds) was, as of `nowS`. */
export function formatAge(thenS: number, nowS: number): string {
  const seconds = Math.max(0, Math.floor(nowS - thenS));
  if (seconds < 60) {
    return `${seconds}s`;
  }
  if (seconds < 3600) {
    return `${Math.floor(seconds / 60)}m`;
  }
  if (seconds < 86400) {
    return `${Math.floor(seconds / 3600)}h`;
  }
  return `${Math.floor(seconds / 86400)}d`;
}

export function formatBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined || !Number.isFinite(bytes)) {
    return '–';
  }
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value >= 100 || unit === 0 ? value.toFixed(0) : value.toFixed(1)} ${units[unit]}`;
}

export interface IProgress {
  step: number | null;
  total: number | null;
  /** 0..1 when the total is known. */
  fraction: number | null;
  label: string;
}

/** Training progress: the backend's own figure if it reports one, else the last finished `step` request. */
export function jobProgress(job: IJob, requests: IRequestSummary[] = []): IProgress {
  let step: number | null = job.progress?.step ?? null;
  const total: number | null = job.progress?.total_steps ?? null;
  if (step === null) {
    for (const request of requests) {
      const value = request.op === 'step' && request.status === 'succeeded' ? request.result?.step : undefined;
      if (typeof value === 'number' && (step === null || value > step)) {
        step = value;
      }
    }
  }
  const fraction = step !== null && total ? Math.min(1, step / total) : null;
  const label = step === null ? '' : total ? `step ${step}/${total}` : `step ${step}`;
  return { step, total, fraction, label };
}

/** A request's id: `request_id` in a request's own JSON, `id` in the job's request list. */
export function requestIdOf(request: IRequestSummary): string | null {
  return request.request_id ?? request.id ?? null;
}

export interface IJobRow {
  jobId: string;
  title: string;
  status: string;
  terminal: boolean;
  age: string;
  model: string;
  device: string;
  failure: string | null;
  progress: IProgress;
}

export function jobRow(job: IJob, nowS: number, requests: IRequestSummary[] = []): IJobRow {
  const models = Array.from(new Set(job.sub_jobs.map(sub => sub.base_model)));
  const devices = Array.from(new Set(job.sub_jobs.map(sub => sub.device).filter(Boolean))) as string[];
  return {
    jobId: job.job_id,
    title: job.name || job.job_id,
    status: job.status,
    terminal: isTerminal(job.status),
    age: formatAge(job.created_at, nowS),
    model: models.join(', '),
    device: devices.join(', '),
    failure: job.failure_code ? `${job.failure_code}${job.failure_message ? `: ${job.failure_message}` : ''}` : null,
    progress: jobProgress(job, requests)
  };
}

/** Jobs that need watching first (running, then queued), then the finished ones, newest first. */
export function sortJobs(jobs: IJob[]): IJob[] {
  const rank = (job: IJob): number => (isTerminal(job.status) ? 1 : 0);
  return [...jobs].sort((a, b) => rank(a) - rank(b) || b.created_at - a.created_at);
}

export interface IDeviceRow {
  id: string;
  name: string;
  kind: string;
  slotsInUse: number;
  slots: number;
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
    return `${host.host}: ${host.slots_available}/${host.slots_total} slots free${models}`;
  });
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
  return capacity.devices.map((device: IDevice) => {
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

export function sortCheckpoints(checkpoints: ICheckpoint[]): ICheckpoint[] {
  return [...checkpoints].sort((a, b) => b.created_at - a.created_at);
}

/** The sidebar's state, refreshed by the poller; views re-render on `changed`. */
export interface IPanelState {
  status: IStatus | null;
  capacity: ICapacity | null;
  hostSamples: IMetricSample[];
  gpuUnavailableReason: string | null;
  jobs: IJob[];
  requestsByJob: Record<string, IRequestSummary[]>;
  error: string | null;
  updatedAt: number | null;
}

export class PanelModel {
  private _state: IPanelState = {
    status: null,
    capacity: null,
    hostSamples: [],
    gpuUnavailableReason: null,
    jobs: [],
    requestsByJob: {},
    error: null,
    updatedAt: null
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

  hosts(): string[] {
    return hostLines(this._state.capacity);
  }

  devices(): IDeviceRow[] {
    return deviceRows(this._state.capacity, this._state.hostSamples);
  }

  jobRows(nowS: number): IJobRow[] {
    return sortJobs(this._state.jobs).map(job => jobRow(job, nowS, this._state.requestsByJob[job.job_id]));
  }

  /** Running or queued jobs among `jobs`, whose progress is worth fetching. */
  activeJobIdsOf(jobs: IJob[] = this._state.jobs): string[] {
    return jobs.filter(job => !isTerminal(job.status)).map(job => job.job_id);
  }
}

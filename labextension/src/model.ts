/**
 * The panel's data model: what the sidebar and job view show, computed from the backend's JSON.
 * Pure TypeScript (no JupyterLab imports), so every rule here is unit-tested with jest.
 */
import { API_VERSION, PACKAGE_VERSION } from './contract';
import { formatBytes } from './format';
import { IJobRow, ITrainingSummary, finishedTrainings, isTerminal, jobRow, listedJobs } from './jobrows';
import { ICapacity, ICheckpointView, IDeviceCapacity, IJobView, ILogLine, IMetricSample, IHostMetrics, IJobMetrics, IExtensionStatus } from './types';

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
    compareSelection: []
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

  /** Jobs still going, and finished jobs that never trained. */
  jobRows(nowS: number): IJobRow[] {
    return listedJobs(this._state.jobs).map(job => jobRow(job, nowS));
  }

  finishedTrainings(nowS: number): ITrainingSummary[] {
    return finishedTrainings(this._state.jobs, nowS);
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

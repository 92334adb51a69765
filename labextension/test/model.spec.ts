import { API_VERSION, PACKAGE_VERSION } from '../src/contract';
import { formatAge, formatBytes } from '../src/format';
import {
  LogBuffer,
  MetricSeries,
  PanelModel,
  adapterHostLines,
  hostingLine,
  quantizedModelsLine,
  weekUsageLine,
  connectionState,
  deviceRows,
  gpuMetricsNote,
  hostLines,
  noLocalBackend,
  versionWarnings
} from '../src/model';
import { ICapacity, ILogLine, IMetricSample, IExtensionStatus } from '../src/types';
import { adapterSlotsWords } from '../src/widgets/devices';
import { job, progress } from './jobs';

export function status(overrides: Partial<IExtensionStatus> = {}): IExtensionStatus {
  return {
    backend_url: 'http://127.0.0.1:8765',
    source: { kind: 'config', description: 'http://127.0.0.1:8765, set by CortexServerApp.backend_url', state_file: null,
      pid: null, can_start_local: false },
    extension: { version: PACKAGE_VERSION, api_version: API_VERSION },
    backend: { service: 'cortex-nb-backend', version: PACKAGE_VERSION, api_version: API_VERSION },
    reachable: true,
    authenticated: true,
    identity: { owner: 'admin', scopes: ['admin'] },
    versions_match: true,
    api_compatible: true,
    error: null,
    ...overrides
  };
}

const CPU_CAPACITY: ICapacity = {
  devices: [{ id: 'cpu', kind: 'cpu', index: null, name: 'CPU', memory_bytes: null, slots: 8, slots_in_use: 1, slots_available: 7 }],
  slots_total: 8,
  slots_in_use: 1,
  slots_available: 7,
  pending: 0,
  pending_slots: 0,
  pending_jobs: []
};

const GPU_CAPACITY: ICapacity = {
  devices: [
    { id: 'cuda:0', kind: 'cuda', index: 0, name: 'NVIDIA H200', memory_bytes: 140 * 2 ** 30, slots: 4, slots_in_use: 2, slots_available: 2, sampler: 'vllm' },
    { id: 'cuda:1', kind: 'cuda', index: 1, name: 'NVIDIA H200', memory_bytes: 140 * 2 ** 30, slots: 4, slots_in_use: 0, slots_available: 4, sampler: 'transformers', adapter_slots: 64, adapter_slots_in_use: 5, adapter_slots_available: 59 }
  ],
  slots_total: 8,
  slots_in_use: 2,
  slots_available: 6,
  pending: 0,
  pending_slots: 0,
  pending_jobs: []
};

describe('versions', () => {
  it('says nothing when panel, extension and backend agree', () => {
    expect(versionWarnings(status())).toEqual([]);
    expect(versionWarnings(null)).toEqual([]);
  });

  it('warns when the panel and the server extension differ', () => {
    const warnings = versionWarnings(status({ extension: { version: '0.0.9', api_version: API_VERSION } }));
    expect(warnings.some(w => w.includes(`panel is version ${PACKAGE_VERSION}`) && w.includes('0.0.9'))).toBe(true);
  });

  it('warns when the backend runs another release, and louder on another API major', () => {
    const minor = versionWarnings(status({ backend: { service: 'cortex-nb-backend', version: '0.2.0', api_version: '1.3' } }));
    expect(minor).toHaveLength(1);
    expect(minor[0]).toContain('0.2.0');
    const major = versionWarnings(status({ backend: { service: 'cortex-nb-backend', version: '2.0.0', api_version: '2.0' } }));
    expect(major).toHaveLength(2);
    expect(major[1]).toContain('API 2.0');
  });

  it('does not compare versions of a backend it cannot reach', () => {
    expect(versionWarnings(status({ reachable: false, backend: null }))).toEqual([]);
  });
});

describe('connection state', () => {
  it('follows the status report', () => {
    expect(connectionState(null, null)).toBe('unknown');
    expect(connectionState(status(), null)).toBe('connected');
    expect(connectionState(status({ authenticated: false }), null)).toBe('unauthenticated');
    expect(connectionState(status({ reachable: false }), null)).toBe('unreachable');
    expect(connectionState(status(), 'extension_missing: ...')).toBe('error');
  });

  it('offers to start a local backend only when none is configured and none runs', () => {
    const local = { kind: 'local' as const, description: 'no local backend is running', state_file: '/h/backend.json',
      pid: null, can_start_local: true };
    const notRunning = status({
      reachable: false, backend_url: null, source: local,
      error: { code: 'backend_unavailable', message: '...', detail: { local_backend: 'not_running' } }
    });
    expect(noLocalBackend(notRunning)).toBe(true);
    expect(connectionState(notRunning, null)).toBe('no_local_backend');
    // A local backend that runs but does not answer (yet) is not one to start again.
    const starting = status({ reachable: false, source: { ...local, pid: 42 },
      error: { code: 'backend_unavailable', message: 'connection refused' } });
    expect(noLocalBackend(starting)).toBe(false);
    expect(connectionState(starting, null)).toBe('unreachable');
    // A configured backend that is down is never replaced by a local one.
    expect(noLocalBackend(status({ reachable: false, error: notRunning.error }))).toBe(false);
  });
});

describe('formatting', () => {
  it('formats ages', () => {
    expect(formatAge(100, 112.9)).toBe('12s');
    expect(formatAge(0, 300)).toBe('5m');
    expect(formatAge(0, 3 * 3600 + 5)).toBe('3h');
    expect(formatAge(0, 2 * 86400)).toBe('2d');
    expect(formatAge(100, 50)).toBe('0s');
  });

  it('formats bytes in binary units', () => {
    expect(formatBytes(512)).toBe('512 B');
    expect(formatBytes(1536)).toBe('1.5 KiB');
    expect(formatBytes(140 * 2 ** 30)).toBe('140 GiB');
    expect(formatBytes(null)).toBe('–');
  });
});

describe('devices', () => {
  it('shows GPU utilisation and memory from the newest sample per device', () => {
    const samples: IMetricSample[] = [
      { at: 1, device: 'cuda:0', gpu_utilization_percent: 10, gpu_memory_used_bytes: 2 ** 30, gpu_memory_total_bytes: 140 * 2 ** 30, cpu_percent: 5, ram_used_bytes: 1, ram_total_bytes: 2 },
      { at: 2, device: 'cuda:0', gpu_utilization_percent: 87, gpu_memory_used_bytes: 70 * 2 ** 30, gpu_memory_total_bytes: 140 * 2 ** 30, gpu_temperature_c: 61, gpu_power_watts: 402, cpu_percent: 5, ram_used_bytes: 1, ram_total_bytes: 2 }
    ];
    const [first, second] = deviceRows(GPU_CAPACITY, samples);
    expect(first).toMatchObject({ id: 'cuda:0', utilization: 87, memoryFraction: 0.5, temperatureC: 61, powerW: 402, slotsInUse: 2, sampler: 'vllm' });
    expect(first.utilizationLabel).toBe('GPU 87%');
    expect(first.memoryLabel).toBe('memory 70.0 GiB / 140 GiB');
    // No sample for cuda:1 yet: no bar values, but its memory size from capacity.
    expect(second).toMatchObject({ id: 'cuda:1', utilization: null, memoryFraction: null });
    expect(second.memoryLabel).toBe('memory 140 GiB');
  });

  it('counts adapter-host slots apart from processes where a device hosts them', () => {
    const [vllm, hosting] = deviceRows(GPU_CAPACITY, []);
    expect(hosting).toMatchObject({ slotsInUse: 0, slots: 4, adapterSlotsInUse: 5, adapterSlots: 64 });
    expect(adapterSlotsWords(vllm)).toBe('');
    expect(adapterSlotsWords(hosting)).toBe('adapter slots 5/64');
  });

  it('gives a line per host only when the devices span several hosts', () => {
    const host = (name: string, free: number, models?: string[]) => ({
      host: name, devices: [`${name}/cpu`], slots_total: 2, slots_in_use: 2 - free, slots_available: free, models
    });
    expect(hostLines(null)).toEqual([]);
    expect(hostLines({ ...CPU_CAPACITY, hosts: [host('laptop', 2)] })).toEqual([]);
    expect(hostLines({ ...CPU_CAPACITY, hosts: [host('a', 1, ['tiny']), host('gpu-2', 0, ['llama-1b', 'tiny'])] })).toEqual([
      'a: 1/2 slots free · tiny',
      'gpu-2: 0/2 slots free · llama-1b, tiny'
    ]);
    const hosting = { ...host('gpu-3', 2, ['tiny']), adapter_slots_total: 64, adapter_slots_available: 61 };
    expect(hostLines({ ...CPU_CAPACITY, hosts: [host('a', 1), hosting] })[1]).toBe(
      'gpu-3: 2/2 slots free (+61/64 adapter) · tiny'
    );
  });

  it("says this user's device-hours over the week: their share of everyone's, or the whole of their own", () => {
    const stats = (owner: string | null, total: number, byOwner: Record<string, number>) => ({
      since: 0, until: 604800, owner,
      jobs: { total: 0, by_state: {} }, runs: { total: 0, by_state: {} },
      queue_wait: { count: 0, median_s: null, p95_s: null },
      device_seconds: { total, by_owner: byOwner, by_model: {} }
    });
    expect(weekUsageLine(null, 'ana')).toBe('');
    expect(weekUsageLine(stats('ana', 4500, { ana: 4500 }), 'ana')).toBe('your device-hours this week: 1.25 h');
    // an admin token's stats cover everyone: the line is this user's share only
    expect(weekUsageLine(stats(null, 9000, { ana: 1800, bo: 7200 }), 'ana')).toBe('your device-hours this week: 0.50 h');
    expect(weekUsageLine(stats(null, 9000, { bo: 9000 }), 'ana')).toBe('your device-hours this week: 0.000 h');
    expect(weekUsageLine(stats('ana', 18, { ana: 18 }), 'ana')).toBe('your device-hours this week: 0.005 h');
  });

  it('gives a line per adapter host: the slots that share its one base, and what they add', () => {
    expect(adapterHostLines(null)).toEqual([]);
    expect(adapterHostLines({ ...CPU_CAPACITY, executor: { name: 'local', hosting: 'isolation_per_job' } })).toEqual([]);
    const executor = {
      name: 'local',
      hosting: 'adapter_host',
      adapter_hosts: [{ device: 'cpu:0', base_model: 'tiny', pid: 7, slots: 3, base_bytes: 12 * 2 ** 20, slots_bytes: 640 * 2 ** 10 }]
    };
    expect(adapterHostLines({ ...CPU_CAPACITY, executor })).toEqual([
      'adapter host cpu:0 · tiny: 3 slot(s) on one base (12.0 MiB held once; slots add 640 KiB)'
    ]);
    const batching = { ...executor.adapter_hosts[0], batched_operations: ['forward_backward', 'generate'] };
    expect(adapterHostLines({ ...CPU_CAPACITY, executor: { ...executor, adapter_hosts: [batching] } })).toEqual([
      'adapter host cpu:0 · tiny: 3 slot(s) on one base (12.0 MiB held once; slots add 640 KiB);' +
        ' generate and forward_backward batched across slots'
    ]);
    // GPU_CAPACITY's cuda:0 samples with vLLM: its host's sampling slots share one vLLM engine
    const onVllm = { ...executor.adapter_hosts[0], device: 'cuda:0' };
    const onBuiltIn = { ...executor.adapter_hosts[0], device: 'cuda:1' };
    expect(adapterHostLines({ ...GPU_CAPACITY, executor: { ...executor, adapter_hosts: [onVllm, onBuiltIn] } })).toEqual([
      'adapter host cuda:0 · tiny: 3 slot(s) on one base (12.0 MiB held once; slots add 640 KiB);' +
        ' its vLLM sampling slots share one vLLM engine',
      'adapter host cuda:1 · tiny: 3 slot(s) on one base (12.0 MiB held once; slots add 640 KiB)'
    ]);
  });

  it('says how sub-jobs are hosted and whether CPU workers are forks, in the words of %cortex capacity', () => {
    expect(hostingLine(null)).toEqual([]);
    expect(hostingLine({ ...CPU_CAPACITY, executor: { name: 'ray' } })).toEqual([]);
    const forked = { name: 'local', hosting: 'auto', fork_server: { pid: 9 } };
    const mixed = { ...CPU_CAPACITY, devices: [...GPU_CAPACITY.devices, ...CPU_CAPACITY.devices] };
    expect(hostingLine({ ...mixed, executor: forked })).toEqual([
      'hosting: adapter hosts on GPUs (slots share a process and its base), a process per sub-job on CPUs;' +
        ' CPU workers forked from one process'
    ]);
    // where only one half of `auto` applies, only that half is said
    expect(hostingLine({ ...CPU_CAPACITY, executor: forked })).toEqual([
      'hosting: a process per sub-job; CPU workers forked from one process'
    ]);
    expect(hostingLine({ ...GPU_CAPACITY, executor: { name: 'local', hosting: 'auto' } })).toEqual([
      'hosting: adapter hosts (slots share a process and its base)'
    ]);
    expect(hostingLine({ ...CPU_CAPACITY, executor: { name: 'local', hosting: 'isolation_per_job' } })).toEqual([
      'hosting: a process per sub-job on every device'
    ]);
  });

  it('names the bases held quantized, in the words of %cortex capacity', () => {
    expect(quantizedModelsLine(null)).toEqual([]);
    expect(quantizedModelsLine({ ...CPU_CAPACITY, quantized_models: {} })).toEqual([]);
    expect(quantizedModelsLine({ ...CPU_CAPACITY, quantized_models: { 'llama-8b': 'nf4', 'big-int': 'int8' } })).toEqual([
      'quantized bases: big-int int8, llama-8b nf4'
    ]);
  });

  it('shows CPU and RAM on a host without GPU fields (never zeros for absent GPU data)', () => {
    const samples: IMetricSample[] = [{ at: 5, device: null, cpu_percent: 42.4, ram_used_bytes: 6 * 2 ** 30, ram_total_bytes: 24 * 2 ** 30 }];
    const [cpu] = deviceRows(CPU_CAPACITY, samples);
    // a backend from before sampling engines were chosen per device says nothing about them
    expect(cpu).toMatchObject({ utilization: 42.4, memoryFraction: 0.25, temperatureC: null, powerW: null, sampler: null });
    expect(cpu.utilizationLabel).toBe('CPU 42%');
    expect(cpu.memoryLabel).toBe('RAM 6.0 GiB / 24.0 GiB');
  });

  it('says in one quiet line that a CPU host has no GPU metrics', () => {
    expect(gpuMetricsNote({ gpu_unavailable_reason: 'NVML Shared Library Not Found',
      gpu_metrics_note: 'CPU host: no GPU metrics' })).toBe('CPU host: no GPU metrics');
    expect(gpuMetricsNote({ gpu_unavailable_reason: 'driver too old' })).toBe('no GPU metrics: driver too old');
    expect(gpuMetricsNote({})).toBeNull();
  });

  it('is empty before the first capacity report', () => {
    expect(deviceRows(null, [])).toEqual([]);
  });
});

function lines(...seqs: number[]): ILogLine[] {
  return seqs.map(seq => ({ seq, at: seq, sub_job_id: 'training-0', stream: 'stdout', line: `line ${seq}` }));
}

describe('LogBuffer', () => {
  it('keeps lines in order without duplicates across overlapping pages', () => {
    const buffer = new LogBuffer(100);
    expect(buffer.append(lines(1, 2, 3), 3).map(l => l.seq)).toEqual([1, 2, 3]);
    expect(buffer.append(lines(2, 3, 4, 5), 5).map(l => l.seq)).toEqual([4, 5]);
    expect(buffer.lines.map(l => l.seq)).toEqual([1, 2, 3, 4, 5]);
    expect(buffer.cursor).toBe(5);
  });

  it('advances the cursor on an empty page and counts lines the backend dropped', () => {
    const buffer = new LogBuffer(100);
    buffer.append([], 40, 40);
    expect(buffer.cursor).toBe(40);
    expect(buffer.dropped).toBe(40);
  });

  it('keeps only the newest lines beyond its capacity', () => {
    const buffer = new LogBuffer(3);
    buffer.append(lines(1, 2, 3, 4, 5), 5);
    expect(buffer.lines.map(l => l.seq)).toEqual([3, 4, 5]);
    expect(buffer.dropped).toBe(2);
  });
});

describe('MetricSeries', () => {
  it('deduplicates samples, orders them and remembers where to continue', () => {
    const series = new MetricSeries(10);
    series.append([{ at: 2, device: 'cpu', cpu_percent: 20 }, { at: 1, device: 'cpu', cpu_percent: 10 }]);
    series.append([{ at: 2, device: 'cpu', cpu_percent: 20 }, { at: 3, device: 'cpu', cpu_percent: 30 }], 3.5);
    expect(series.points('cpu_percent')).toEqual([[1, 10], [2, 20], [3, 30]]);
    expect(series.since).toBe(3.5);
    expect(series.hasGpu).toBe(false);
  });

  it('detects GPU samples and filters by device', () => {
    const series = new MetricSeries(10);
    series.append([
      { at: 1, device: 'cuda:0', gpu_utilization_percent: 50 },
      { at: 1, device: 'cuda:1', gpu_utilization_percent: 70 }
    ]);
    expect(series.hasGpu).toBe(true);
    expect(series.points('gpu_utilization_percent', 'cuda:1')).toEqual([[1, 70]]);
  });

  it('drops the oldest samples beyond its capacity', () => {
    const series = new MetricSeries(2);
    series.append([1, 2, 3].map(at => ({ at, device: 'cpu', cpu_percent: at })));
    expect(series.points('cpu_percent')).toEqual([[2, 2], [3, 3]]);
  });
});

describe('PanelModel', () => {
  it('notifies listeners on update and stops after unsubscribe', () => {
    const model = new PanelModel();
    const seen: string[] = [];
    const stop = model.onChange(m => seen.push(m.connection));
    model.update({ status: status() });
    stop();
    model.update({ error: 'x' });
    expect(seen).toEqual(['connected']);
    expect(model.connection).toBe('error');
  });

  it('lists jobs still going and finished trainings apart', () => {
    const model = new PanelModel();
    model.update({
      capacity: CPU_CAPACITY,
      jobs: [
        job({ job_id: 'sampled', status: 'done', sub_jobs: [] }),
        job({ job_id: 'trained', status: 'done', progress: progress({ phase: 'finished', step: 80 }) }),
        job({ job_id: 'going', status: 'running', progress: progress({ step: 3 }) })
      ]
    });
    const rows = model.jobRows(2000);
    expect(rows.map(r => r.jobId)).toEqual(['going', 'sampled']);
    expect(rows[0].progress.label).toBe('step 3/80');
    expect(model.finishedTrainings(2000).map(t => t.jobId)).toEqual(['trained']);
    expect(model.devices()).toHaveLength(1);
  });

  it('ticks trainings for comparison in order, and unticks them', () => {
    const model = new PanelModel();
    model.toggleCompare('a');
    model.toggleCompare('b');
    model.toggleCompare('c');
    model.toggleCompare('a');
    expect(model.state.compareSelection).toEqual(['b', 'c']);
  });

  it('counts down only while a job idles or keeps alive', () => {
    const model = new PanelModel();
    model.update({ jobs: [job({ status: 'running' })] });
    expect(model.hasCountdown).toBe(false);
    model.update({ jobs: [job({ status: 'running', idle: { timeout_s: 300, frees_at: 2300 } })] });
    expect(model.hasCountdown).toBe(true);
    model.update({ jobs: [job({ status: 'done', keep_alive_until: 2300 })] });
    expect(model.hasCountdown).toBe(false);
  });
});

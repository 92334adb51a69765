/** The sidebar's devices section: one card per GPU (or CPU slot group) with live bars. */
import { meter } from '../charts/meter';
import { h } from '../dom';
import { IDeviceRow } from '../model';

export function renderDevices(
  rows: IDeviceRow[], gpuMetricsNote: string | null, hosts: string[] = [], weekUsage = ''
): HTMLElement {
  const section = h('section', { class: 'cortex-section cortex-devices' }, h('h3', {}, 'Devices'));
  if (weekUsage) {
    section.appendChild(h('div', { class: 'cortex-muted cortex-week-usage' }, weekUsage));
  }
  for (const line of hosts) {
    section.appendChild(h('div', { class: 'cortex-muted cortex-host' }, line));
  }
  if (!rows.length) {
    section.appendChild(h('div', { class: 'cortex-muted' }, 'no devices reported yet'));
  }
  for (const row of rows) {
    const extras = [
      row.temperatureC !== null ? `${Math.round(row.temperatureC)}°C` : '',
      row.powerW !== null ? `${Math.round(row.powerW)} W` : '',
      row.sampler ? `sampling: ${row.sampler}` : '',
      adapterSlotsWords(row)
    ].filter(Boolean);
    section.appendChild(
      h('div', { class: 'cortex-device', 'data-device': row.id },
        h('div', { class: 'cortex-device-head' },
          h('span', { class: 'cortex-device-name' }, `${row.id} · ${row.name}`),
          h('span', { class: 'cortex-muted' }, `${row.slotsInUse}/${row.slots} in use`)
        ),
        meter(row.utilizationLabel, row.utilization === null ? null : row.utilization / 100, 'util'),
        meter(row.memoryLabel, row.memoryFraction, 'memory'),
        extras.length ? h('div', { class: 'cortex-muted' }, extras.join(' · ')) : null
      )
    );
  }
  if (gpuMetricsNote) {
    section.appendChild(h('div', { class: 'cortex-muted cortex-gpu-reason' }, gpuMetricsNote));
  }
  return section;
}

/** On a device with an adapter host: its slots in use (they share one process, beside the process slots). */
export function adapterSlotsWords(row: IDeviceRow): string {
  return row.adapterSlots ? `adapter slots ${row.adapterSlotsInUse}/${row.adapterSlots}` : '';
}

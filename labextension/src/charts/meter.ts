/** A horizontal bar for a fraction (utilisation, memory), with its label. */
import { h } from '../dom';

export function meter(label: string, fraction: number | null, kind: 'util' | 'memory'): HTMLElement {
  const percent = fraction === null ? 0 : Math.round(Math.max(0, Math.min(1, fraction)) * 100);
  const level = percent >= 90 ? 'high' : percent >= 60 ? 'mid' : 'low';
  const fill = h('div', { class: `cortex-meter-fill cortex-meter-${kind} cortex-meter-${level}` });
  fill.style.width = `${percent}%`;
  return h(
    'div',
    {
      class: 'cortex-meter',
      role: 'meter',
      'aria-label': label,
      'aria-valuemin': 0,
      'aria-valuemax': 100,
      'aria-valuenow': fraction === null ? undefined : percent
    },
    h('div', { class: 'cortex-meter-track' }, fill),
    h('span', { class: 'cortex-meter-label' }, label)
  );
}

/**
 * The sidebar's filter: a text box (name, id or tag) and "Show short-lived jobs" (the ones compare and
 * sampling on demand start, hidden by default). Built once and kept across renders, so typing keeps focus.
 */
import { h } from '../dom';
import { PanelModel } from '../model';

export function filterBar(model: PanelModel): HTMLElement {
  const text = h('input', {
    type: 'search', class: 'cortex-filter-text', placeholder: 'Filter jobs by name, id or tag',
    'aria-label': 'Filter jobs by name, id or tag', value: model.state.filter.text
  });
  text.addEventListener('input', () => model.setFilter({ text: text.value }));
  const shortLived = h('input', {
    type: 'checkbox', class: 'cortex-filter-short-lived', checked: model.state.filter.showShortLived
  });
  shortLived.addEventListener('change', () => model.setFilter({ showShortLived: shortLived.checked }));
  const hidden = h('span', { class: 'cortex-filter-hidden cortex-muted' });
  const note = (): void => {
    const count = model.hiddenShortLived;
    hidden.textContent = count ? ` (${count} hidden)` : '';
  };
  model.onChange(note);
  note();
  return h('div', { class: 'cortex-filter' },
    text,
    h('label', { class: 'cortex-filter-label', title: 'Jobs that %cortex compare and sampling on demand start for themselves' },
      shortLived, ' Show short-lived jobs', hidden)
  );
}

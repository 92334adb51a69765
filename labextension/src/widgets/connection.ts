/** The sidebar's connection section: state, versions and any version-mismatch warning. */
import { PACKAGE_VERSION } from '../contract';
import { h } from '../dom';
import { ConnectionState } from '../model';
import { IStatus } from '../types';

const STATE_TEXT: Record<ConnectionState, string> = {
  unknown: 'connecting…',
  connected: 'connected',
  unauthenticated: 'backend refused the server token',
  unreachable: 'backend unreachable',
  error: 'error'
};

export function renderConnection(
  state: ConnectionState,
  status: IStatus | null,
  warnings: string[],
  error: string | null
): HTMLElement {
  const section = h('section', { class: 'cortex-section cortex-connection', 'data-state': state });
  section.appendChild(
    h('div', { class: 'cortex-connection-line' },
      h('span', { class: `cortex-dot cortex-dot-${state}` }),
      h('span', { class: 'cortex-connection-state' }, STATE_TEXT[state]),
      status?.identity?.owner ? h('span', { class: 'cortex-muted' }, ` as ${status.identity.owner}`) : null
    )
  );
  if (status) {
    section.appendChild(h('div', { class: 'cortex-muted cortex-backend-url', title: 'backend URL' }, status.backend_url));
  }
  section.appendChild(
    h('div', { class: 'cortex-versions' },
      `panel ${PACKAGE_VERSION} · extension ${status?.extension.version ?? '?'} · backend ${status?.backend?.version ?? '?'}`
    )
  );
  const problem = error ?? (status && status.error ? `${status.error.code}: ${status.error.message}` : null);
  if (problem) {
    section.appendChild(h('div', { class: 'cortex-error' }, problem));
  }
  for (const warning of warnings) {
    section.appendChild(h('div', { class: 'cortex-warning', role: 'alert' }, warning));
  }
  return section;
}

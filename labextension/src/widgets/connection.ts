/**
 * The sidebar's connection section: state, which backend and how it was found, versions, any
 * version-mismatch warning, and "Start local backend" when none is configured and none runs.
 */
import { PACKAGE_VERSION } from '../contract';
import { h } from '../dom';
import { ConnectionState } from '../model';
import { IExtensionStatus } from '../types';

const STATE_TEXT: Record<ConnectionState, string> = {
  unknown: 'connecting…',
  connected: 'connected',
  unauthenticated: 'backend refused the server token',
  unreachable: 'backend unreachable',
  no_local_backend: 'no local backend running',
  error: 'error'
};

export interface IConnectionProps {
  state: ConnectionState;
  status: IExtensionStatus | null;
  warnings: string[];
  error: string | null;
  startingLocal: boolean;
  startError: string | null;
  startLocal: () => void;
}

export function renderConnection(props: IConnectionProps): HTMLElement {
  const { state, status, warnings, error } = props;
  const section = h('section', { class: 'cortex-section cortex-connection', 'data-state': state });
  const owner = status?.reachable ? status.identity?.owner : null;
  section.appendChild(
    h('div', { class: 'cortex-connection-line' },
      h('span', { class: `cortex-dot cortex-dot-${state}` }),
      h('span', { class: 'cortex-connection-state' }, STATE_TEXT[state]),
      owner ? h('span', { class: 'cortex-muted' }, ` as ${owner}`) : null
    )
  );
  if (status?.backend_url) {
    section.appendChild(h('div', { class: 'cortex-muted cortex-backend-url', title: 'backend URL' }, status.backend_url));
  }
  if (status?.source) {
    const how = status.source.kind === 'local' ? 'local backend' : status.source.kind === 'config' ? 'configured backend'
      : 'backend from CORTEX_URL';
    section.appendChild(
      h('div', { class: 'cortex-muted cortex-backend-source', 'data-source': status.source.kind, title: status.source.description },
        status.source.kind === 'local' && status.source.state_file ? `${how} · ${status.source.state_file}` : how)
    );
  }
  if (state === 'no_local_backend') {
    const start = h('button', { class: 'jp-Button cortex-button cortex-start-local', disabled: props.startingLocal },
      props.startingLocal ? 'Starting local backend…' : 'Start local backend');
    start.addEventListener('click', () => {
      start.disabled = true;
      props.startLocal();
    });
    section.appendChild(
      h('div', { class: 'cortex-start-local-box' },
        h('div', {}, 'Notebooks that run %cortex connect --local share one backend on this machine; it shows here ' +
          'as soon as it runs. Start it now:'),
        start
      )
    );
  }
  section.appendChild(
    h('div', { class: 'cortex-versions' },
      `panel ${PACKAGE_VERSION} · extension ${status?.extension.version ?? '?'} · backend ${status?.backend?.version ?? '?'}`
    )
  );
  const problem = props.startError ?? error ??
    (status && status.error && state !== 'no_local_backend' ? `${status.error.code}: ${status.error.message}` : null);
  if (problem) {
    section.appendChild(h('div', { class: 'cortex-error' }, problem));
  }
  for (const warning of warnings) {
    section.appendChild(h('div', { class: 'cortex-warning', role: 'alert' }, warning));
  }
  return section;
}

/**
 * The sidebar's finished trainings: each with its word, final loss per token, eval loss and how long it
 * took; tick two or more and "Compare" opens their curves overlaid, with a table, in the main area.
 */
import { h, wordBadge } from '../dom';
import { formatDuration, formatLoss } from '../format';
import { ITrainingSummary } from '../jobrows';
import { IJobRowActions, identityLine, rowActions } from './rowactions';

export interface ITrainingsProps {
  trainings: ITrainingSummary[];
  selection: string[];
  toggle: (jobId: string) => void;
  openJob: (jobId: string) => void;
  compare: (jobIds: string[]) => void;
  actions: IJobRowActions;
}

export function renderTrainings(props: ITrainingsProps): HTMLElement {
  const { trainings, selection } = props;
  const chosen = selection.filter(id => trainings.some(t => t.jobId === id));
  const compare = h('button', {
    class: 'jp-Button cortex-button cortex-compare', disabled: chosen.length < 2,
    title: chosen.length < 2 ? 'Tick two or more trainings to compare them' : `Compare ${chosen.length} trainings`
  }, chosen.length >= 2 ? `Compare ${chosen.length}` : 'Compare');
  compare.addEventListener('click', () => props.compare(chosen));
  const section = h('section', { class: 'cortex-section cortex-trainings' },
    h('div', { class: 'cortex-section-head' }, h('h3', {}, 'Finished trainings'), trainings.length ? compare : null)
  );
  if (!trainings.length) {
    section.appendChild(h('div', { class: 'cortex-muted' }, 'none yet'));
    return section;
  }
  const list = h('ul', { class: 'cortex-job-list' });
  for (const training of trainings) {
    const tick = h('input', {
      type: 'checkbox', class: 'cortex-compare-tick', checked: chosen.includes(training.jobId),
      'aria-label': `compare ${training.title}`
    });
    tick.addEventListener('click', event => event.stopPropagation());
    tick.addEventListener('change', () => props.toggle(training.jobId));
    const figures = [
      `loss per token ${formatLoss(training.finalLoss)}`,
      training.finalEval !== null ? `eval ${formatLoss(training.finalEval)}` : '',
      `took ${formatDuration(training.durationS)}`,
      training.totalSteps ? `${training.steps}/${training.totalSteps} steps` : `${training.steps} steps`
    ].filter(Boolean);
    const item = h('li', {
      class: 'cortex-job cortex-training', 'data-job-id': training.jobId, tabindex: 0,
      title: `Open ${training.title} (${training.jobId})`
    },
      h('div', { class: 'cortex-job-head' },
        tick,
        h('span', { class: 'cortex-job-title' }, training.title),
        wordBadge(training.word)
      ),
      h('div', { class: 'cortex-job-training cortex-muted' }, figures.join(' · ')),
      identityLine(training.jobId, training.start, training.tags),
      rowActions(training.jobId, true, props.actions)
    );
    item.addEventListener('click', () => props.openJob(training.jobId));
    item.addEventListener('keydown', event => {
      if (event.key === 'Enter') {
        props.openJob(training.jobId);
      }
    });
    list.appendChild(item);
  }
  section.appendChild(list);
  return section;
}

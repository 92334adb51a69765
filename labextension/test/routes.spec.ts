import { PROXIED_ROUTES } from '../src/contract';
import { RouteUnavailableError, hasRoute, routePath } from '../src/routes';
import { jobIdFromEvent } from '../src/openlink';

describe('routes from the generated contract', () => {
  it('fills placeholders as single encoded segments and adds the query', () => {
    expect(routePath('job_logs', { job_id: 'job a/b' }, { cursor: 3, wait: 20, sub_job: undefined })).toEqual({
      method: 'GET',
      path: '/v1/jobs/job%20a%2Fb/logs?cursor=3&wait=20'
    });
    expect(routePath('cancel_job', { job_id: 'job-1' })).toEqual({ method: 'POST', path: '/v1/jobs/job-1/cancel' });
  });

  it('holds only routes the proxy forwards', () => {
    expect(hasRoute('list_jobs')).toBe(true);
    expect(hasRoute('whoami')).toBe(false);
    expect(Object.values(PROXIED_ROUTES).every(route => route.template.startsWith('/'))).toBe(true);
  });

  it('refuses a route this version does not have, and a missing placeholder', () => {
    expect(() => routePath('no_such_route')).toThrow(RouteUnavailableError);
    expect(() => routePath('get_job', {})).toThrow('needs a value for {job_id}');
  });
});

describe('open-in-sidebar links', () => {
  function element(attributes: Record<string, string>, parent: any = null): any {
    return { nodeType: 1, parentElement: parent, getAttribute: (name: string) => attributes[name] ?? null };
  }

  it('finds the job id on the clicked element or an ancestor', () => {
    const button = element({ 'data-cortex-open-job': 'job-42', class: 'cortex-open-in-sidebar' });
    const icon = element({}, button);
    expect(jobIdFromEvent(button)).toBe('job-42');
    expect(jobIdFromEvent(icon)).toBe('job-42');
    expect(jobIdFromEvent(element({}))).toBeNull();
    expect(jobIdFromEvent(null)).toBeNull();
  });
});

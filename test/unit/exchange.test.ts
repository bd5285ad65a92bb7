import { describe, expect, it } from 'vitest';
import {
  isEnded,
  resendable,
  START,
  step,
  type ExchangeEvent,
  type ExchangeState,
  type FailedAttempt,
  type Phase,
} from '../../src/proxy/exchange.js';

/** The forwarding state machine, without sockets: every transition and the actions it asks for. */

const at = (phase: Phase, resent = false): ExchangeState => ({ phase, resent });
const timer = (clientStillSending: boolean, bridgeBackedUp: boolean): ExchangeEvent => ({
  type: 'timer',
  clientStillSending,
  bridgeBackedUp,
});

/** Runs events from the start and returns the phases passed through and every action asked for. */
function run(...events: ExchangeEvent[]): { phases: Phase[]; actions: string[] } {
  let state = START;
  const phases: Phase[] = [state.phase];
  const actions: string[] = [];
  for (const event of events) {
    const next = step(state, event);
    state = next.state;
    phases.push(state.phase);
    actions.push(...next.actions);
  }
  return { phases, actions };
}

describe('an exchange that goes well', () => {
  it('sends, waits, streams and ends, restarting the bridge timer at each step', () => {
    expect(run({ type: 'request-sent' }, { type: 'response' }, { type: 'response-end' })).toEqual({
      phases: ['sending', 'waiting', 'streaming', 'done'],
      actions: ['refresh-timer', 'refresh-timer', 'pass-answer', 'clear-timer'],
    });
  });

  it('passes on an answer that comes before the bridge has read the whole body', () => {
    expect(run({ type: 'response' }, { type: 'request-sent' }, { type: 'response-end' }).phases).toEqual([
      'sending',
      'streaming',
      'streaming',
      'done',
    ]);
  });
});

describe('the bridge timer', () => {
  it('is the client’s while it still uploads and the bridge reads: it starts again', () => {
    expect(step(at('sending'), timer(true, false))).toEqual({ state: at('sending'), actions: ['refresh-timer'] });
  });

  it('starts again when a body read whole is all here, for the bridge is only reached then', () => {
    expect(step(at('sending'), { type: 'body-read' })).toEqual({ state: at('sending'), actions: ['refresh-timer'] });
    for (const phase of ['waiting', 'streaming'] as const)
      expect(step(at(phase), { type: 'body-read' })).toEqual({ state: at(phase), actions: [] });
  });

  it('is the bridge’s once it stops reading the body: 504', () => {
    expect(step(at('sending'), timer(true, true))).toEqual({
      state: at('timed-out'),
      actions: ['abort-bridge', 'answer-504'],
    });
  });

  it('is the bridge’s once it has the whole request (also for a connection that never opened): 504', () => {
    expect(step(at('waiting'), timer(false, false)).actions).toEqual(['abort-bridge', 'answer-504']);
    expect(step(at('sending'), timer(false, false)).state.phase).toBe('timed-out');
  });

  it('cuts the client connection when the bridge stalls mid-answer', () => {
    expect(step(at('streaming'), timer(false, false))).toEqual({
      state: at('cut'),
      actions: ['abort-bridge', 'close-client'],
    });
  });
});

describe('a bridge that fails', () => {
  it('before its status line: 502', () => {
    for (const phase of ['sending', 'waiting'] as const) {
      expect(step(at(phase), { type: 'bridge-error', resendable: false })).toEqual({
        state: at('unreachable'),
        actions: ['clear-timer', 'abort-bridge', 'answer-502'],
      });
    }
  });

  it('on a reused connection it had closed, for a safe request: sent once more, and only once', () => {
    const first = step(at('waiting'), { type: 'bridge-error', resendable: true });
    expect(first).toEqual({ state: { phase: 'sending', resent: true }, actions: ['resend'] });
    expect(step(first.state, { type: 'bridge-error', resendable: true }).state.phase).toBe('unreachable');
  });

  it('after its status line: the client connection is cut, never a 502 written into an answer', () => {
    expect(step(at('streaming'), { type: 'bridge-error', resendable: true })).toEqual({
      state: at('cut'),
      actions: ['clear-timer', 'close-client'],
    });
  });
});

describe('the one resend', () => {
  /** A GET without a body that met a kept-alive connection the bridge had closed. */
  const stale: FailedAttempt = {
    method: 'GET',
    hasBody: false,
    answered: false,
    keptAlive: true,
    connectionClosed: true,
  };

  it('is for a GET or HEAD without a body that met a kept-alive connection the bridge had closed', () => {
    expect(resendable(stale)).toBe(true);
    expect(resendable({ ...stale, method: 'HEAD' })).toBe(true);
  });

  it('is not for a request the bridge failed on a new connection (regression: a dropped GET reached the bridge twice)', () => {
    expect(resendable({ ...stale, keptAlive: false })).toBe(false);
  });

  it('is not for an answer that is not HTTP, even on a kept-alive connection (regression: reached the bridge twice)', () => {
    expect(resendable({ ...stale, connectionClosed: false })).toBe(false);
    expect(resendable({ ...stale, keptAlive: false, connectionClosed: false })).toBe(false);
  });

  it('is not for a request with a body, any other method, or once the status line came', () => {
    expect(resendable({ ...stale, hasBody: true })).toBe(false);
    for (const method of ['POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS', 'get']) {
      expect(resendable({ ...stale, method }), method).toBe(false);
    }
    expect(resendable({ ...stale, answered: true })).toBe(false);
  });
});

describe('the client', () => {
  it('sending more than MAX_BODY_BYTES gets 413, or a cut once the answer began', () => {
    expect(step(at('sending'), { type: 'body-too-large' })).toEqual({
      state: at('too-large'),
      actions: ['clear-timer', 'stop-reading', 'abort-bridge', 'answer-413'],
    });
    expect(step(at('streaming'), { type: 'body-too-large' }).state.phase).toBe('cut');
  });

  it('sending body bytes its headers did not announce has its connection closed, whatever the phase', () => {
    for (const phase of ['sending', 'waiting', 'streaming'] as const) {
      expect(step(at(phase), { type: 'framing-mismatch' })).toEqual({
        state: at('cut'),
        actions: ['clear-timer', 'stop-reading', 'abort-bridge', 'close-client'],
      });
    }
  });

  it('whose body the parser failed on (malformed, or not all come within REQUEST_TIMEOUT_MS) gets the answer to that, and the bridge request is aborted', () => {
    for (const phase of ['sending', 'waiting'] as const) {
      expect(step(at(phase), { type: 'client-failed' })).toEqual({
        state: at('client-failed'),
        actions: ['clear-timer', 'stop-reading', 'abort-bridge', 'answer-client-failure'],
      });
    }
    expect(step(at('streaming'), { type: 'client-failed' }).state.phase).toBe('cut');
  });

  it('leaving ends the exchange and aborts the bridge request', () => {
    for (const phase of ['sending', 'waiting', 'streaming'] as const) {
      expect(step(at(phase), { type: 'client-gone' })).toEqual({
        state: at('client-gone'),
        actions: ['clear-timer', 'abort-bridge'],
      });
    }
  });
});

describe('an ended exchange', () => {
  it('ignores whatever the sockets still report', () => {
    const events: ExchangeEvent[] = [
      { type: 'body-read' },
      { type: 'request-sent' },
      { type: 'response' },
      { type: 'response-end' },
      timer(true, true),
      { type: 'bridge-error', resendable: true },
      { type: 'body-too-large' },
      { type: 'framing-mismatch' },
      { type: 'client-failed' },
      { type: 'client-gone' },
    ];
    for (const phase of [
      'done',
      'timed-out',
      'unreachable',
      'too-large',
      'client-failed',
      'cut',
      'client-gone',
    ] as const) {
      expect(isEnded(at(phase))).toBe(true);
      for (const event of events) expect(step(at(phase), event)).toEqual({ state: at(phase), actions: [] });
    }
    for (const phase of ['sending', 'waiting', 'streaming'] as const) expect(isEnded(at(phase))).toBe(false);
  });

  it('is reached from every phase by every path, and no transition asks for both an answer and a cut', () => {
    const events: ExchangeEvent[] = [
      { type: 'body-read' },
      { type: 'request-sent' },
      { type: 'response' },
      { type: 'response-end' },
      timer(true, false),
      timer(true, true),
      timer(false, false),
      { type: 'bridge-error', resendable: true },
      { type: 'bridge-error', resendable: false },
      { type: 'body-too-large' },
      { type: 'framing-mismatch' },
      { type: 'client-failed' },
      { type: 'client-gone' },
    ];
    for (const phase of ['sending', 'waiting', 'streaming'] as const) {
      for (const resent of [false, true]) {
        for (const event of events) {
          const { actions } = step(at(phase, resent), event);
          const answers = actions.filter((a) => a.startsWith('answer-') || a === 'pass-answer');
          expect(answers.length, `${phase} ${event.type}`).toBeLessThanOrEqual(1);
          if (answers.length) expect(actions, `${phase} ${event.type}`).not.toContain('close-client');
          // A gateway answer is only ever written before the bridge's status line was passed on.
          if (phase === 'streaming') expect(actions.some((a) => a.startsWith('answer-'))).toBe(false);
        }
      }
    }
  });
});

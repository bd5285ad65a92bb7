/**
 * One request's exchange with a bridge, as a state machine: every state, event and transition of
 * forwarding is here, and only here; the forwarder (proxy/forwarder.ts) turns socket events into
 * events, and actions into socket calls. The rules (README "Forwarding", "Bridges"):
 *
 * - The bridge has UPSTREAM_TIMEOUT_MS to send its status line from the moment it has the whole
 *   request; a slow upload is the client's time (bounded by REQUEST_TIMEOUT_MS), unless the bridge
 *   stops reading it. A body read whole before it is sent (proxy/forwarder.ts, GATHERED_BODY_BYTES)
 *   starts the bridge's time afresh when it is all here, since only then is the bridge reached.
 *   No status line in time: 504. Cannot be reached: 502.
 * - Once the status line was passed on, a bridge that breaks off or stalls UPSTREAM_TIMEOUT_MS
 *   cuts the client's connection: a cut answer, never a wrong one.
 * - A GET or HEAD that meets a kept-alive connection the bridge had just closed is sent once more
 *   (RFC 9112 §9.3.1); nothing else is ever retried.
 * - A streamed body over MAX_BODY_BYTES: 413 before the answer began, else a cut.
 * - Body bytes on a request whose headers announce none: the client connection is closed (its
 *   framing was not the gateway's; docs/operations.md "Hostile clients").
 * - A body that has not all come within REQUEST_TIMEOUT_MS, or that Node's parser failed on
 *   (lib/client-failure.ts): the answer the HTTP layer marked the request with (408, 400, 413),
 *   and what the bridge has of it is dropped.
 */

export type Phase =
  /** The request (head and body) is on its way to the bridge; no status line yet. */
  | 'sending'
  /** The bridge has the whole request; no status line yet. */
  | 'waiting'
  /** The bridge's status line was passed on; its body flows to the client. */
  | 'streaming'
  // Ends:
  /** The bridge's whole answer was passed on. */
  | 'done'
  /** 504 */
  | 'timed-out'
  /** 502 */
  | 'unreachable'
  /** 413 */
  | 'too-large'
  /** The client's body did not come in time, or was malformed: the answer to that (408, 400, 413). */
  | 'client-failed'
  /** The client's connection was closed mid-exchange (a broken or stalled bridge, untrusted framing). */
  | 'cut'
  /** The client left first (logged as 499). */
  | 'client-gone';

export interface ExchangeState {
  readonly phase: Phase;
  /** The one resend of a safe request has been used. */
  readonly resent: boolean;
}

export type ExchangeEvent =
  /** A body read whole before it is sent is all here: it goes to the bridge now. */
  | { readonly type: 'body-read' }
  /** The bridge has the request's last byte. */
  | { readonly type: 'request-sent' }
  | { readonly type: 'response' }
  | { readonly type: 'response-end' }
  /** UPSTREAM_TIMEOUT_MS passed without progress. */
  | { readonly type: 'timer'; readonly clientStillSending: boolean; readonly bridgeBackedUp: boolean }
  /** The connection to the bridge failed; `resendable`: what resendable() says of the failed attempt. */
  | { readonly type: 'bridge-error'; readonly resendable: boolean }
  | { readonly type: 'body-too-large' }
  | { readonly type: 'framing-mismatch' }
  /** Node's parser failed on the client's body, or REQUEST_TIMEOUT_MS passed before it was all here. */
  | { readonly type: 'client-failed' }
  | { readonly type: 'client-gone' };

/** What is known of an attempt that failed before its answer, for the one resend. */
export interface FailedAttempt {
  readonly method: string;
  /** The request has a body: it was the client's stream, or read from it, and is not sent twice. */
  readonly hasBody: boolean;
  /** The bridge's status line had come. */
  readonly answered: boolean;
  /** The attempt was written on a connection that had carried earlier answers (a kept-alive one). */
  readonly keptAlive: boolean;
  /** The connection was closed or reset; not, say, an answer that was not HTTP. */
  readonly connectionClosed: boolean;
}

const RESENDABLE_METHODS: ReadonlySet<string> = new Set(['GET', 'HEAD']);

/**
 * Whether a failed attempt may be sent once more: a GET or HEAD without a body that met a
 * kept-alive connection the bridge had closed (RFC 9112 §9.3.1) before any status line came on it.
 * A bridge that closes a new connection on a request, or answers it with bytes that are not HTTP,
 * has failed that request itself, and would only be sent it twice (README "Forwarding": nothing
 * else is ever retried).
 */
export function resendable(attempt: FailedAttempt): boolean {
  return (
    attempt.keptAlive &&
    attempt.connectionClosed &&
    !attempt.answered &&
    !attempt.hasBody &&
    RESENDABLE_METHODS.has(attempt.method)
  );
}

export type ExchangeAction =
  | 'refresh-timer'
  | 'clear-timer'
  /** Destroy the request to the bridge (and its connection). */
  | 'abort-bridge'
  /** Send the request again, on a new connection. */
  | 'resend'
  /** Pass the bridge's status line, headers and body on. */
  | 'pass-answer'
  | 'answer-502'
  | 'answer-504'
  | 'answer-413'
  /** The answer the HTTP layer marked the request with (lib/client-failure.ts). */
  | 'answer-client-failure'
  /** Stop reading the client's body. */
  | 'stop-reading'
  /** Destroy the client's connection. */
  | 'close-client';

export interface Transition {
  readonly state: ExchangeState;
  readonly actions: readonly ExchangeAction[];
}

/** The phases after which nothing more happens: every event leaves them as they are. */
const ENDED_PHASES: readonly Phase[] = [
  'done',
  'timed-out',
  'unreachable',
  'too-large',
  'client-failed',
  'cut',
  'client-gone',
];
const PHASES: readonly Phase[] = ['sending', 'waiting', 'streaming', ...ENDED_PHASES];

// Every state exists once, and every list of actions is a constant: a step allocates nothing.
const STATES = [false, true].map(
  (resent) => new Map(PHASES.map((phase): [Phase, ExchangeState] => [phase, Object.freeze({ phase, resent })])),
);
const stateOf = (phase: Phase, resent: boolean): ExchangeState => STATES[resent ? 1 : 0]?.get(phase) as ExchangeState;

export const START: ExchangeState = stateOf('sending', false);

const ENDED: ReadonlySet<Phase> = new Set(ENDED_PHASES);

export function isEnded(state: ExchangeState): boolean {
  return ENDED.has(state.phase);
}

const NOTHING: readonly ExchangeAction[] = [];
const REFRESH: readonly ExchangeAction[] = ['refresh-timer'];
const PASS: readonly ExchangeAction[] = ['refresh-timer', 'pass-answer'];
const CLEAR: readonly ExchangeAction[] = ['clear-timer'];
const STALLED: readonly ExchangeAction[] = ['abort-bridge', 'close-client'];
const TIMED_OUT: readonly ExchangeAction[] = ['abort-bridge', 'answer-504'];
const CUT_AFTER_ERROR: readonly ExchangeAction[] = ['clear-timer', 'close-client'];
const RESEND: readonly ExchangeAction[] = ['resend'];
const UNREACHABLE: readonly ExchangeAction[] = ['clear-timer', 'abort-bridge', 'answer-502'];
const TOO_LARGE_CUT: readonly ExchangeAction[] = ['clear-timer', 'stop-reading', 'abort-bridge', 'close-client'];
const TOO_LARGE: readonly ExchangeAction[] = ['clear-timer', 'stop-reading', 'abort-bridge', 'answer-413'];
const MISMATCH: readonly ExchangeAction[] = ['clear-timer', 'stop-reading', 'abort-bridge', 'close-client'];
const CLIENT_FAILED: readonly ExchangeAction[] = [
  'clear-timer',
  'stop-reading',
  'abort-bridge',
  'answer-client-failure',
];
const GONE: readonly ExchangeAction[] = ['clear-timer', 'abort-bridge'];

const stay = (state: ExchangeState, actions: readonly ExchangeAction[] = NOTHING): Transition => ({ state, actions });
const to = (state: ExchangeState, phase: Phase, actions: readonly ExchangeAction[] = NOTHING): Transition => ({
  state: stateOf(phase, state.resent),
  actions,
});

export function step(state: ExchangeState, event: ExchangeEvent): Transition {
  const { phase } = state;
  // After an end, whatever the sockets still report changes nothing.
  if (ENDED.has(phase)) return stay(state);
  const answered = phase === 'streaming';
  switch (event.type) {
    case 'body-read':
      // The upload was the client's time; connecting and sending it is the bridge's, from now.
      return phase === 'sending' ? stay(state, REFRESH) : stay(state);
    case 'request-sent':
      // From now on any wait is the bridge's.
      return phase === 'sending' ? to(state, 'waiting', REFRESH) : stay(state);
    case 'response':
      // A bridge may answer before it has read the whole body (an early refusal): that answer is passed on too.
      return answered ? stay(state) : to(state, 'streaming', PASS);
    case 'response-end':
      return answered ? to(state, 'done', CLEAR) : stay(state);
    case 'timer':
      if (answered) return to(state, 'cut', STALLED);
      // The client is still uploading and the bridge takes all of it: the client is the slow one.
      if (phase === 'sending' && event.clientStillSending && !event.bridgeBackedUp) return stay(state, REFRESH);
      return to(state, 'timed-out', TIMED_OUT);
    case 'bridge-error':
      // After the status line a failure cuts the answer: the client must not take a short body for a whole one.
      if (answered) return to(state, 'cut', CUT_AFTER_ERROR);
      if (event.resendable && !state.resent) return { state: stateOf('sending', true), actions: RESEND };
      return to(state, 'unreachable', UNREACHABLE);
    case 'body-too-large':
      return answered ? to(state, 'cut', TOO_LARGE_CUT) : to(state, 'too-large', TOO_LARGE);
    case 'framing-mismatch':
      return to(state, 'cut', MISMATCH);
    case 'client-failed':
      // The HTTP layer tells only of a request with no answer begun; after one, nothing is left but a cut.
      return answered ? to(state, 'cut', MISMATCH) : to(state, 'client-failed', CLIENT_FAILED);
    case 'client-gone':
      return to(state, 'client-gone', GONE);
  }
}

/**
 * One request's exchange with a bridge, as a state machine: every state, event and transition of
 * forwarding is here, and only here; the forwarder (proxy/forwarder.ts) turns socket events into
 * events, and actions into socket calls. The rules (README "Forwarding", "Bridges"):
 *
 * - The bridge has UPSTREAM_TIMEOUT_MS to send its status line from the moment it has the whole
 *   request; a slow upload is the client's time (bounded by REQUEST_TIMEOUT_MS), unless the bridge
 *   stops reading it. No status line in time: 504. Cannot be reached: 502.
 * - Once the status line was passed on, a bridge that breaks off or stalls UPSTREAM_TIMEOUT_MS
 *   cuts the client's connection: a cut answer, never a wrong one.
 * - A GET or HEAD that meets a kept-alive connection the bridge had just closed is sent once more
 *   (RFC 9112 §9.3.1); nothing else is ever retried.
 * - A streamed body over MAX_BODY_BYTES: 413 before the answer began, else a cut.
 * - Body bytes on a request whose headers announce none: the client connection is closed (its
 *   framing was not the gateway's; README "Hostile clients").
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
  /** The bridge has the request's last byte. */
  | { readonly type: 'request-sent' }
  | { readonly type: 'response' }
  | { readonly type: 'response-end' }
  /** The bridge's answer broke off before its end. */
  | { readonly type: 'response-broken' }
  /** UPSTREAM_TIMEOUT_MS passed without progress. */
  | { readonly type: 'timer'; readonly clientStillSending: boolean; readonly bridgeBackedUp: boolean }
  /** The connection to the bridge failed; `resendable`: a safe request on a reused connection the bridge had closed. */
  | { readonly type: 'bridge-error'; readonly resendable: boolean }
  | { readonly type: 'body-too-large' }
  | { readonly type: 'framing-mismatch' }
  | { readonly type: 'client-gone' };

export type ExchangeAction =
  | 'refresh-timer'
  | 'clear-timer'
  /** Destroy the request to the bridge (and its connection). */
  | 'abort-bridge'
  /** Send the request again, on a new connection. */
  | 'resend'
  /** Write the bridge's status line and headers, and start passing its body on. */
  | 'pass-answer'
  | 'answer-502'
  | 'answer-504'
  | 'answer-413'
  /** Stop reading the client's body. */
  | 'stop-reading'
  /** Destroy the client's connection. */
  | 'close-client';

export interface Transition {
  readonly state: ExchangeState;
  readonly actions: readonly ExchangeAction[];
}

export const START: ExchangeState = { phase: 'sending', resent: false };

const ENDED: ReadonlySet<Phase> = new Set(['done', 'timed-out', 'unreachable', 'too-large', 'cut', 'client-gone']);

export function isEnded(state: ExchangeState): boolean {
  return ENDED.has(state.phase);
}

const NOTHING: readonly ExchangeAction[] = [];
const to = (state: ExchangeState, phase: Phase, actions: readonly ExchangeAction[] = NOTHING): Transition => ({
  state: phase === state.phase ? state : { ...state, phase },
  actions,
});

export function step(state: ExchangeState, event: ExchangeEvent): Transition {
  const { phase } = state;
  // After an end, whatever the sockets still report changes nothing.
  if (ENDED.has(phase)) return { state, actions: NOTHING };
  const answered = phase === 'streaming';
  switch (event.type) {
    case 'request-sent':
      // From now on any wait is the bridge's.
      return phase === 'sending' ? to(state, 'waiting', ['refresh-timer']) : { state, actions: NOTHING };
    case 'response':
      // A bridge may answer before it has read the whole body (an early refusal): that answer is passed on too.
      return answered ? { state, actions: NOTHING } : to(state, 'streaming', ['refresh-timer', 'pass-answer']);
    case 'response-end':
      return answered ? to(state, 'done', ['clear-timer']) : { state, actions: NOTHING };
    case 'response-broken':
      return answered ? to(state, 'cut', ['clear-timer', 'abort-bridge', 'close-client']) : { state, actions: NOTHING };
    case 'timer':
      if (answered) return to(state, 'cut', ['abort-bridge', 'close-client']);
      // The client is still uploading and the bridge takes all of it: the client is the slow one.
      if (phase === 'sending' && event.clientStillSending && !event.bridgeBackedUp) {
        return { state, actions: ['refresh-timer'] };
      }
      return to(state, 'timed-out', ['abort-bridge', 'answer-504']);
    case 'bridge-error':
      if (answered) return to(state, 'cut', ['clear-timer', 'close-client']);
      if (event.resendable && !state.resent) return { state: { phase: 'sending', resent: true }, actions: ['resend'] };
      return to(state, 'unreachable', ['clear-timer', 'abort-bridge', 'answer-502']);
    case 'body-too-large':
      if (answered) return to(state, 'cut', ['clear-timer', 'stop-reading', 'abort-bridge', 'close-client']);
      return to(state, 'too-large', ['clear-timer', 'stop-reading', 'abort-bridge', 'answer-413']);
    case 'framing-mismatch':
      return to(state, 'cut', ['clear-timer', 'stop-reading', 'abort-bridge', 'close-client']);
    case 'client-gone':
      return to(state, 'client-gone', ['clear-timer', 'abort-bridge']);
  }
}

/**
 * The request fields the gateway removes or states itself on the way to a bridge (README
 * "Forwarding"): read by the forwarder (proxy/headers.ts) and by the settings, which refuse a
 * consumer field of one of these names.
 */

export const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'proxy-authorization',
  'proxy-authenticate',
]);

/**
 * Fields with which some frameworks let a request claim another method or path than the one it
 * was counted for: the bridge must act on exactly what was counted.
 */
const REINTERPRETING = [
  'x-http-method-override',
  'x-http-method',
  'x-method-override',
  'x-original-url',
  'x-rewrite-url',
];

/**
 * Fields in which some servers read the client's address as one value (nginx's `X-Real-IP` and its
 * kin). The gateway is the edge (or trusts TRUST_PROXY_HOPS proxies before it), so a client's own
 * value would be a claim nobody checked: the bridge gets the address the gateway found instead.
 */
export const CLIENT_ADDRESS_FIELDS = new Set([
  'x-real-ip',
  'true-client-ip',
  'x-client-ip',
  'x-cluster-client-ip',
  'cf-connecting-ip',
  'fastly-client-ip',
]);

/** Request fields the gateway writes itself (below), whatever the client sent. */
export const REWRITTEN = new Set([
  ...REINTERPRETING,
  ...CLIENT_ADDRESS_FIELDS,
  'forwarded',
  'expect',
  'host',
  'content-length',
  'x-forwarded-for',
  'x-forwarded-proto',
  'x-forwarded-host',
  'x-request-id',
]);

/** Whether the gateway removes or states `field` (lower case) itself, whatever a client sends. */
export function isGatewayField(field: string): boolean {
  return HOP_BY_HOP.has(field) || REWRITTEN.has(field);
}

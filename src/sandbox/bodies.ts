/**
 * Answers of the bridges as the specification describes them (sections 2.1 and 7). The error body of a
 * failed login, with its Vietnamese text, is what the real bridges send; the gateway passes it
 * through byte for byte.
 */

export type BridgeKind = 'eqt' | 'fno';

export const DEMO_USERNAME = 'demo';
export const DEMO_PASSWORD = 'demo-password';

/** HTTP status of a failed login: the specification does not show it; `messageParams.s` says 500, and so does the sandbox. */
export const LOGIN_FAILED_STATUS = 500;

/** The specification's error body for a wrong username or password, exactly as the bridge writes it. */
export function loginFailedBody(kind: BridgeKind): string {
  const code = kind === 'eqt' ? 'OAPI_EQT_500' : 'OAPI_FNO_500';
  return (
    `{"code":"${code}","messageParams":{"error":"server_error",` +
    `"error_description":"-107: Tên đăng nhập hoặc mật khẩu không đúng","s":500},` +
    `"params":null,"source":"oapi-bridge-${kind}","message":null}`
  );
}

/** The specification's token set: all five fields. */
export function tokenSetBody(tokens: { access: string; refresh: string; otp: string }): string {
  return JSON.stringify({
    access_token: tokens.access,
    refresh_token: tokens.refresh,
    expires_in: 3600,
    otp_token: tokens.otp,
    token_type: 'Bearer',
  });
}

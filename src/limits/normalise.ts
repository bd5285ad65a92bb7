/**
 * Normalisation of a request target before it is matched and forwarded (README "A request, step by step").
 *
 * The bridge receives exactly the path that was matched and counted, so every spelling
 * that a server could read as another path is either folded into one form or refused:
 *  - dot segments are resolved (RFC 3986 §5.2.4), `..` never climbs above the root;
 *  - repeated slashes and a trailing slash are dropped;
 *  - percent-encoded unreserved characters are decoded and other escapes upper-cased
 *    (RFC 3986 §6.2.2), so `%2e%2E` is a dot segment and `%6Frders` is `orders`;
 *  - so are the other characters a segment holds as they are (`:@!$&'()*+,=`, RFC 3986 §3.3
 *    pchar): most servers decode the path before they route it, and read `/x/a%3Ab` as `/x/a:b`,
 *    the path of a table literal `a:b` that must not pass as a `{id}` of another row;
 *  - an encoded `/`, `\` or control character, a raw `\`, a raw `;`, a fragment, a malformed
 *    escape or a character outside RFC 3986 `pchar` is refused: such paths are read differently
 *    by different servers, and no legitimate client sends them. (Servlet containers and Spring
 *    cut a segment at `;` as the start of path parameters: `/orders/;x` would reach such a bridge
 *    as `/orders/`, counted as another row.)
 * The query string is forwarded as the client sent it.
 */

export type NormalisedTarget =
  | { readonly ok: true; readonly path: string; readonly segments: readonly string[]; readonly query: string }
  | { readonly ok: false; readonly reason: string };

const HEX = '0123456789ABCDEF';

function hexValue(code: number): number {
  if (code >= 48 && code <= 57) return code - 48; // 0-9
  if (code >= 65 && code <= 70) return code - 55; // A-F
  if (code >= 97 && code <= 102) return code - 87; // a-f
  return -1;
}

/** RFC 3986 §2.3 unreserved: ALPHA / DIGIT / "-" / "." / "_" / "~" */
function isUnreserved(code: number): boolean {
  return (
    (code >= 65 && code <= 90) ||
    (code >= 97 && code <= 122) ||
    (code >= 48 && code <= 57) ||
    code === 45 ||
    code === 46 ||
    code === 95 ||
    code === 126
  );
}

/** RFC 3986 §3.3 pchar without "%": unreserved / sub-delims / ":" / "@" */
function isPlainPchar(code: number): boolean {
  if (isUnreserved(code)) return true;
  switch (code) {
    case 33:
    case 36:
    case 38:
    case 39:
    case 40:
    case 41:
    case 42:
    case 43:
    case 44:
    case 59:
    case 61: // ! $ & ' ( ) * + , ; =
    case 58:
    case 64: // : @
      return true;
    default:
      return false;
  }
}

const refused = (reason: string): NormalisedTarget => ({ ok: false, reason });

export function normaliseTarget(target: string): NormalisedTarget {
  let rest = target;
  // RFC 9112 §3.2.2: a server must accept the absolute form; only its path and query matter here.
  if (!rest.startsWith('/')) {
    const scheme = /^https?:\/\/[^/?#]*/i.exec(rest);
    if (!scheme) return refused('Malformed request target');
    rest = rest.slice(scheme[0].length);
    if (rest === '' || rest.startsWith('?')) rest = '/' + rest;
  }
  if (rest.includes('#')) return refused('Malformed request target');
  const q = rest.indexOf('?');
  const rawPath = q === -1 ? rest : rest.slice(0, q);
  const query = q === -1 ? '' : rest.slice(q);

  const segments: string[] = [];
  let segment = '';
  const closeSegment = (): void => {
    if (segment === '' || segment === '.') {
      // empty (repeated or trailing slash) or "current directory": nothing to add
    } else if (segment === '..') {
      segments.pop();
    } else {
      segments.push(segment);
    }
    segment = '';
  };

  for (let i = 0; i < rawPath.length; i++) {
    const code = rawPath.charCodeAt(i);
    if (code === 47) {
      // "/"
      closeSegment();
    } else if (code === 37) {
      // "%"
      const hi = hexValue(rawPath.charCodeAt(i + 1));
      const lo = hexValue(rawPath.charCodeAt(i + 2));
      if (hi < 0 || lo < 0) return refused('Malformed percent-encoding in path');
      const byte = hi * 16 + lo;
      if (byte === 0x2f || byte === 0x5c) return refused('Encoded slash in path');
      if (byte < 0x20 || byte === 0x7f) return refused('Encoded control character in path');
      // An encoded `;` stays encoded: decoded, it would start path parameters (see above).
      segment += byte !== 59 && isPlainPchar(byte) ? String.fromCharCode(byte) : '%' + HEX[hi] + HEX[lo];
      i += 2;
    } else if (code === 59) {
      // ";"
      return refused('Semicolon in path');
    } else if (isPlainPchar(code)) {
      segment += rawPath[i];
    } else {
      return refused('Invalid character in path');
    }
  }
  closeSegment();
  return { ok: true, path: '/' + segments.join('/'), segments, query };
}

import { isMap, isScalar, isSeq, LineCounter, parseDocument, visit, type Document, type Node } from 'yaml';

/**
 * A YAML file read with positions, shared by the loaders of `limits.yaml`, `gateway.yaml` and
 * the API key file: they validate its plain data, and every complaint about a place in the data
 * names the line and column of its YAML node.
 */

export interface SourceError {
  readonly file: string;
  readonly line: number;
  readonly column: number;
  /** 1-based row of `limits:` (or key entry) the error is in, when it is in one. */
  readonly row?: number;
  readonly rowName?: string;
  readonly message: string;
}

export function formatSourceError(e: SourceError): string {
  const where = e.row === undefined ? '' : `row ${e.row}${e.rowName ? ` (${e.rowName})` : ''}: `;
  return `${e.file}:${e.line}:${e.column}: ${where}${e.message}`;
}

/** The errors of a file's load as one text, `undefined` for a load that passed: what tells two refusals apart. */
export function refusalText(
  load: { readonly ok: true } | { readonly ok: false; readonly errors: readonly SourceError[] },
): string | undefined {
  return load.ok ? undefined : load.errors.map(formatSourceError).join('\n');
}

/** Errors in the order of the file. */
export function byPosition(errors: SourceError[]): SourceError[] {
  return errors.sort((a, b) => a.line - b.line || a.column - b.column);
}

export interface Position {
  readonly line: number;
  readonly column: number;
}

export class YamlSource {
  readonly file: string;
  readonly root: unknown;
  /** The document as plain data (mappings as objects, sequences as arrays); null when empty. */
  readonly data: unknown;
  readonly #lines: LineCounter;

  private constructor(file: string, root: unknown, data: unknown, lines: LineCounter) {
    this.file = file;
    this.root = root;
    this.data = data;
    this.#lines = lines;
  }

  /**
   * Parses `text`; a YAML syntax error (a duplicate key included) comes back as an error. Only
   * the first: after a syntax error the parser's further complaints are its consequences.
   */
  static parse(file: string, text: string): { source: YamlSource; errors: SourceError[] } {
    const lines = new LineCounter();
    const doc = parseDocument(text, {
      lineCounter: lines,
      uniqueKeys: true,
      prettyErrors: false,
      keepSourceTokens: false,
      logLevel: 'error', // no console warning for a mapping used as a key: the schema reports the key
    });
    const errors: SourceError[] = doc.errors.slice(0, 1).map((err) => {
      // An unclosed quote is found only at the end of the file: point at where the quote opens.
      const opened = err.code === 'MISSING_CHAR' ? unclosedQuoteAt(doc, err.pos[0]) : undefined;
      const pos = opened === undefined ? (err.linePos?.[0] ?? lines.linePos(err.pos[0])) : lines.linePos(opened);
      // yaml's own words for a second document name a function of its API, not what is wrong with the file.
      const said = err.code === 'MULTIPLE_DOCS' ? 'a second YAML document: the file must hold one' : err.message;
      const message =
        firstLine(said) +
        (opened === undefined ? '' : ' (the quoted text that starts here runs to the end of the file)');
      return { file, line: pos.line, column: pos.col, message };
    });
    let data: unknown = null;
    try {
      if (errors.length === 0) data = doc.toJS();
    } catch (err) {
      // Aliases that would expand beyond yaml's limit (a "billion laughs" file).
      errors.push({ file, line: 1, column: 1, message: firstLine((err as Error).message) });
    }
    return { source: new YamlSource(file, doc.contents, data, lines), errors };
  }

  /**
   * The node at `path` in the data (with `onKey`, the key of the last step rather than its value);
   * where the path leaves the document (a missing key), the last node on it.
   */
  at(path: readonly (string | number)[], onKey = false): unknown {
    let node = this.root;
    for (const [i, step] of path.entries()) {
      const pair = isMap(node) ? node.items.find((p) => keyText(p.key) === String(step)) : undefined;
      const next: unknown = pair ? (onKey && i === path.length - 1 ? pair.key : (pair.value ?? pair.key)) : undefined;
      const item: unknown = isSeq(node) && typeof step === 'number' ? node.items[step] : next;
      if (item === undefined || item === null) return node;
      node = item;
    }
    return node;
  }

  position(node: unknown): Position {
    const range = (node as Node | undefined)?.range;
    if (!range) return { line: 1, column: 1 };
    const pos = this.#lines.linePos(range[0]);
    return { line: pos.line, column: pos.col };
  }

  error(node: unknown, message: string, row?: { row: number; rowName?: string }): SourceError {
    return { file: this.file, ...this.position(node), ...row, message };
  }
}

/** Start of the quoted scalar that runs up to `end`, where the parser gave up looking for its closing quote. */
function unclosedQuoteAt(doc: Document, end: number): number | undefined {
  let start: number | undefined;
  visit(doc, {
    Scalar(_key, node) {
      if ((node.type === 'QUOTE_DOUBLE' || node.type === 'QUOTE_SINGLE') && node.range && node.range[1] >= end) {
        start = node.range[0];
        return visit.BREAK;
      }
      return undefined;
    },
  });
  return start;
}

function firstLine(message: string): string {
  return message.split('\n')[0] ?? message;
}

/** A mapping key as plain data names it: a scalar's value as text. */
function keyText(key: unknown): string {
  return isScalar(key) ? String(key.value) : String(key);
}

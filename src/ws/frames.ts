/**
 * Where WebSocket frames begin and end in a byte stream (RFC 6455 §5.2). The gateway relays
 * bytes, not frames; it only needs to know frame boundaries so that, when it shuts down, it
 * can stop a stream between two frames and add a Close frame of its own.
 */

export class FrameBoundary {
  #header: number[] = [];
  #headerLength = 2;
  #payloadLeft = 0;

  get atBoundary(): boolean {
    return this.#header.length === 0 && this.#payloadLeft === 0;
  }

  /**
   * Reads `chunk`; with `stopAtBoundary`, stops as soon as a frame ends. Returns the bytes
   * read: `chunk.length` unless it stopped at a boundary inside the chunk.
   */
  advance(chunk: Uint8Array, stopAtBoundary = false): number {
    let i = 0;
    if (stopAtBoundary && this.atBoundary) return 0;
    while (i < chunk.length) {
      if (this.#payloadLeft > 0) {
        const take = Math.min(this.#payloadLeft, chunk.length - i);
        this.#payloadLeft -= take;
        i += take;
        if (this.#payloadLeft === 0 && stopAtBoundary) return i;
        continue;
      }
      this.#header.push(chunk[i++] as number);
      if (this.#header.length === 2) {
        const second = this.#header[1] as number;
        const length7 = second & 0x7f;
        this.#headerLength = 2 + (length7 === 126 ? 2 : length7 === 127 ? 8 : 0) + (second & 0x80 ? 4 : 0);
      }
      if (this.#header.length >= 2 && this.#header.length === this.#headerLength) {
        this.#payloadLeft = payloadLength(this.#header);
        this.#header = [];
        if (this.#payloadLeft === 0 && stopAtBoundary) return i;
      }
    }
    return i;
  }
}

function payloadLength(header: number[]): number {
  const length7 = (header[1] as number) & 0x7f;
  if (length7 < 126) return length7;
  if (length7 === 126) return ((header[2] as number) << 8) | (header[3] as number);
  let length = 0;
  for (let k = 2; k < 10; k++) length = length * 256 + (header[k] as number);
  return length;
}

/** A Close frame with `code` and `reason`; masked when it is sent as a client (RFC 6455 §5.3). */
export function closeFrame(code: number, reason: string, masked: boolean): Buffer {
  const text = Buffer.from(reason, 'utf8').subarray(0, 123);
  const payload = Buffer.alloc(2 + text.length);
  payload.writeUInt16BE(code, 0);
  text.copy(payload, 2);
  if (!masked) return Buffer.concat([Buffer.from([0x88, payload.length]), payload]);
  const mask = Buffer.from([0x37, 0xfa, 0x21, 0x3d].map((b) => b ^ (Math.random() * 256)));
  for (let k = 0; k < payload.length; k++) payload[k] = (payload[k] as number) ^ (mask[k % 4] as number);
  return Buffer.concat([Buffer.from([0x88, 0x80 | payload.length]), mask, payload]);
}

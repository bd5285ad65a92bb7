import { describe, expect, it } from 'vitest';
import { closeFrame, FrameBoundary } from '../../src/ws/frames.js';

function frame(payloadLength: number, masked: boolean): Buffer {
  const header: number[] = [0x82];
  const maskBit = masked ? 0x80 : 0;
  if (payloadLength < 126) header.push(maskBit | payloadLength);
  else if (payloadLength < 65536) header.push(maskBit | 126, payloadLength >> 8, payloadLength & 255);
  else {
    header.push(maskBit | 127);
    for (let k = 7; k >= 0; k--) header.push(Math.floor(payloadLength / 2 ** (8 * k)) & 255);
  }
  if (masked) header.push(1, 2, 3, 4);
  return Buffer.concat([Buffer.from(header), Buffer.alloc(payloadLength, 7)]);
}

describe('FrameBoundary', () => {
  it('follows frames of every length encoding, masked or not, however the bytes are split', () => {
    const stream = Buffer.concat([
      frame(0, false),
      frame(5, true),
      frame(300, false),
      frame(70_000, true),
      frame(1, false),
    ]);
    for (const split of [1, 3, 7, 64, 1000, stream.length]) {
      const tracker = new FrameBoundary();
      for (let i = 0; i < stream.length; i += split) tracker.advance(stream.subarray(i, i + split));
      expect(tracker.atBoundary).toBe(true);
    }
  });

  it('knows it is mid-frame, and where the frame ends', () => {
    const tracker = new FrameBoundary();
    const f = frame(300, false);
    tracker.advance(f.subarray(0, 100));
    expect(tracker.atBoundary).toBe(false);
    const next = Buffer.concat([f.subarray(100), frame(10, false)]);
    expect(tracker.advance(next, true)).toBe(f.length - 100);
    expect(tracker.atBoundary).toBe(true);
  });

  it('writes Close frames: plain from the server, masked from a client (RFC 6455 §5.3)', () => {
    const plain = closeFrame(1001, 'bye', false);
    expect([...plain.subarray(0, 4)]).toEqual([0x88, 5, 0x03, 0xe9]);
    expect(plain.subarray(4).toString()).toBe('bye');
    const masked = closeFrame(1001, 'bye', true);
    expect(masked[1]).toBe(0x80 | 5);
    const mask = masked.subarray(2, 6);
    const payload = Buffer.from(masked.subarray(6).map((b, i) => b ^ (mask[i % 4] as number)));
    expect(payload.readUInt16BE(0)).toBe(1001);
    expect(payload.subarray(2).toString()).toBe('bye');
  });
});

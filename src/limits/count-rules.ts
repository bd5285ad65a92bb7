import type { ConsumeRequest, MergeEntry, Usage, WindowIds } from './store.js';

/**
 * The two rules every counter-store backend follows, each beside its Lua twin: the in-memory
 * store runs the TypeScript function, the Redis store the script, and a change to one must be
 * made to the other (test/integration/count-rules.test.ts runs both on random counters and
 * compares). README "A request, step by step" (how counting works) and docs/operations.md
 * "Redis" say why they are so.
 */

/** A counter as a backend keeps it: the start and count of its hour and of its day window. */
export interface StoredCounter {
  hourStart: number;
  hour: number;
  dayStart: number;
  day: number;
}

/** What a counter holds in the windows `ids` name: the count of each of its windows that is not over. */
export function usageIn(stored: StoredCounter | undefined, ids: WindowIds): Usage {
  return {
    hour: stored && stored.hourStart >= ids.hourStart ? stored.hour : 0,
    day: stored && stored.dayStart >= ids.dayStart ? stored.day : 0,
  };
}

/**
 * One request: allowed when both windows have room, then one unit is added to each; a refused
 * request changes nothing. Windows only move forward: when another instance, whose clock is
 * slightly ahead, has already started the next window, this step counts in that window rather
 * than resetting it.
 */
export function countStep(
  stored: StoredCounter | undefined,
  request: ConsumeRequest,
): { allowed: boolean; hourStart: number; hour: number; dayStart: number; day: number } {
  let hourStart = request.hourStart;
  let dayStart = request.dayStart;
  let hour = 0;
  let day = 0;
  if (stored) {
    if (stored.hourStart >= hourStart) {
      hourStart = stored.hourStart;
      hour = stored.hour;
    }
    if (stored.dayStart >= dayStart) {
      dayStart = stored.dayStart;
      day = stored.day;
    }
  }
  if (!request.force && (hour >= request.hourLimit || day >= request.dayLimit)) {
    return { allowed: false, hourStart, hour, dayStart, day };
  }
  return { allowed: true, hourStart, hour: hour + 1, dayStart, day: day + 1 };
}

/**
 * Receipts of one instance a counter keeps at most, the newest. Twice the calls an instance lets
 * out at once (redis/consume-batcher.ts, MAX_CALLS_OUT): a bound on what a counter holds while a
 * call of the instance stays unsettled (on a Cluster, behind a node that is down), never reached
 * by the calls between one in doubt and its undo.
 */
export const RECEIPTS_KEPT = 512;

/**
 * The receipt of one counting call (redis/receipt-ledger.ts; docs/operations.md "Redis": no unit
 * is counted twice): the counter field of the instance that sent it, the call's sequence number
 * there, and the lowest sequence number of that instance's calls still unsettled (out, or in
 * doubt and not yet taken back) when it was sent.
 */
export interface Receipt {
  readonly field: string;
  readonly seq: number;
  readonly oldestUnsettled: number;
}

/**
 * countStep in Lua, for every request of one call in turn. KEYS: one counter per request
 * (repeats allowed); ARGV: the windows every request of the call counts in (hourStart,
 * dayStart, expireAt), the requests' limits in one argument (`hourLimit,dayLimit,force,` per
 * request), the call's receipt (see pushConsumeArgs). Answers three numbers per request: allowed, hour
 * count, day count. Each counter is read once and written once, so a batch costs Redis no more
 * than its distinct counters. A counter that gained units records `seq:units:hourStart:dayStart,`
 * (the windows the units went in, which are the counter's, not the call's, when another instance
 * had already moved it on) in front of the sending instance's own field (`rc:<instance>`), newest first, and drops that instance's
 * receipts older than its oldest unsettled call, which nothing will ever take back (and any past
 * RECEIPTS_KEPT): a receipt stays as long as the receipt ledger may need it, and no other
 * instance's calls touch it. A new day sets the counter's expiry, which takes every field with it.
 */
export const CONSUME_SCRIPT = `
local hs = tonumber(ARGV[1])
local ds = tonumber(ARGV[2])
local expireAt = ARGV[3]
local limits = ARGV[4]
local field = ARGV[5]
local seq = ARGV[6]
local oldest = tonumber(ARGV[7])
local at = 1
local counters = {}
local order = {}
local out = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local hourLimit, dayLimit, force, nextAt = string.match(limits, '^([^,]*),([^,]*),([^,]*),()', at)
  if not nextAt then return redis.error_reply('consume: no limits for key ' .. i) end
  at = nextAt
  local c = counters[key]
  if not c then
    local v = redis.call('HMGET', key, 'hs', 'hc', 'ds', 'dc', field)
    c = { hs = tonumber(v[1]), hc = tonumber(v[2]) or 0, ds = tonumber(v[3]), dc = tonumber(v[4]) or 0, rc = v[5] or '', added = 0 }
    counters[key] = c
    order[#order + 1] = key
  end
  local hc, dc = c.hc, c.dc
  if not c.hs or c.hs < hs then hc = 0 end
  if not c.ds or c.ds < ds then dc = 0 end
  if force ~= '1' and (hc >= tonumber(hourLimit) or dc >= tonumber(dayLimit)) then
    out[#out + 1] = 0
  else
    if not c.hs or c.hs < hs then c.hs = hs end
    if not c.ds or c.ds < ds then c.ds = ds; c.newDay = true end
    hc = hc + 1
    dc = dc + 1
    c.hc, c.dc = hc, dc
    c.added = c.added + 1
    out[#out + 1] = 1
  end
  out[#out + 1] = hc
  out[#out + 1] = dc
end
for _, key in ipairs(order) do
  local c = counters[key]
  if c.added > 0 then
    -- Receipts are newest first: keep them up to the first one older than the oldest unsettled call,
    -- RECEIPTS_KEPT with this one at most.
    local keep = 0
    for _ = 2, ${RECEIPTS_KEPT} do
      local colon = string.find(c.rc, ':', keep + 1, true)
      if not colon or tonumber(string.sub(c.rc, keep + 1, colon - 1)) < oldest then break end
      keep = string.find(c.rc, ',', colon, true)
    end
    local rc = seq .. ':' .. c.added .. ':' .. c.hs .. ':' .. c.ds .. ',' .. string.sub(c.rc, 1, keep)
    redis.call('HSET', key, 'hs', c.hs, 'hc', c.hc, 'ds', c.ds, 'dc', c.dc, field, rc)
    if c.newDay then redis.call('PEXPIREAT', key, expireAt) end
  end
end
return out
`;

/**
 * Appends the ARGV of one CONSUME_SCRIPT call to `out` (which holds its KEYS, one per item):
 * the windows of the first request (every request of a call shares them), the limits of every
 * request in one argument, the receipt. One argument rather than three per request: ioredis
 * copies and measures every argument of a command one by one (docs/performance.md, change 13).
 */
export function pushConsumeArgs(
  out: Array<string | number>,
  items: ReadonlyArray<{ readonly request: ConsumeRequest }>,
  receipt: Receipt,
): void {
  const { hourStart, dayStart, expireAt } = (items[0] as { readonly request: ConsumeRequest }).request;
  let limits = '';
  for (const { request: r } of items) limits += r.hourLimit + ',' + r.dayLimit + (r.force ? ',1,' : ',0,');
  out.push(hourStart, dayStart, expireAt, limits, receipt.field, receipt.seq, receipt.oldestUnsettled);
}

/**
 * Units counted elsewhere (docs/operations.md "Redis": the outage's admissions end up in
 * Redis): units of a window the counter is still in are added; a window the counter has not
 * reached yet starts with them; a window the counter has already left behind (another instance
 * started the next one) is not touched, since those units belong to a window that is over.
 */
export function mergeStep(stored: StoredCounter | undefined, entry: MergeEntry): StoredCounter {
  let { hourStart, hour, dayStart, day } = entry;
  if (stored) {
    if (stored.hourStart > hourStart) ({ hourStart, hour } = stored);
    else if (stored.hourStart === hourStart) hour += stored.hour;
    if (stored.dayStart > dayStart) ({ dayStart, day } = stored);
    else if (stored.dayStart === dayStart) day += stored.day;
  }
  return { hourStart, hour, dayStart, day };
}

/** Arguments per merged counter: hourStart, hour, dayStart, day, expireAt (see mergeArgs). */
const ARGS_PER_MERGE = 5;

/**
 * mergeStep in Lua, for distinct counters. KEYS: the counters; ARGV: mergeArgs of each. A
 * counter whose day is new gets the entry's expiry; receipts (`rc:*`) are left as they are, so
 * the calls they name can still be taken back. Answers the number of counters.
 */
export const MERGE_SCRIPT = `
for i = 1, #KEYS do
  local a = (i - 1) * ${ARGS_PER_MERGE}
  local v = redis.call('HMGET', KEYS[i], 'hs', 'hc', 'ds', 'dc')
  local hs, hc = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local ds, dc = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local shs, sds = tonumber(v[1]), tonumber(v[3])
  if shs and shs > hs then hs, hc = shs, tonumber(v[2]) or 0 elseif shs == hs then hc = hc + (tonumber(v[2]) or 0) end
  local newDay = not sds or sds < ds
  if sds and sds > ds then ds, dc = sds, tonumber(v[4]) or 0 elseif sds == ds then dc = dc + (tonumber(v[4]) or 0) end
  redis.call('HSET', KEYS[i], 'hs', hs, 'hc', hc, 'ds', ds, 'dc', dc)
  if newDay then redis.call('PEXPIREAT', KEYS[i], ARGV[a + 5]) end
end
return #KEYS
`;

/** The ARGV of one entry in a MERGE_SCRIPT call. */
export function mergeArgs(e: MergeEntry): number[] {
  return [e.hourStart, e.hour, e.dayStart, e.day, e.expireAt];
}

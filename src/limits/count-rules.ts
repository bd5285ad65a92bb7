import type { ConsumeRequest, MergeEntry, Usage, WindowIds } from './store.js';

/**
 * The two rules every counter-store backend follows, each beside its Lua twin: the in-memory
 * store runs the TypeScript function, the Redis store the script, and a change to one must be
 * made to the other (test/integration/count-rules.test.ts runs both on random counters and
 * compares). README "A request, step by step" (how counting works) and docs/operations.md
 * "Redis" say why they are so.
 */

/** A counter as a backend keeps it: the start and count of its hour and of its day window, and their timezone. */
export interface StoredCounter {
  hourStart: number;
  hour: number;
  dayStart: number;
  day: number;
  zone?: string | undefined;
}

/** Nominal window lengths, seconds: how long a window of another timezone is taken to last. */
const HOUR_SECONDS = 3600;
const DAY_SECONDS = 86_400;

/** The counter's windows are of another timezone than the request's (the table's zone changed). */
function otherZone(stored: StoredCounter, zone: string | undefined): boolean {
  return stored.zone !== undefined && zone !== undefined && stored.zone !== zone;
}

/** What a counter holds in the windows `ids` name: the count of each of its windows that is not over. */
export function usageIn(stored: StoredCounter | undefined, ids: WindowIds): Usage {
  if (!stored) return { hour: 0, day: 0 };
  if (otherZone(stored, ids.zone)) {
    return {
      hour: stored.hourStart + HOUR_SECONDS > ids.hourStart ? stored.hour : 0,
      day: stored.dayStart + DAY_SECONDS > ids.dayStart ? stored.day : 0,
    };
  }
  return {
    hour: stored.hourStart >= ids.hourStart ? stored.hour : 0,
    day: stored.dayStart >= ids.dayStart ? stored.day : 0,
  };
}

/**
 * One request: allowed when both windows have room, then one unit is added to each; a refused
 * request changes nothing. Windows only move forward: when another instance, whose clock is
 * slightly ahead, has already started the next window, this step counts in that window rather
 * than resetting it. A counter whose windows are of another timezone (the table's changed) keeps
 * the count of each window that still overlaps the request's, taken as lasting an hour and a day,
 * and takes the request's bounds and zone: a change of zone starts no window afresh, and the next
 * window of the new zone does.
 */
export function countStep(
  stored: StoredCounter | undefined,
  request: ConsumeRequest,
): {
  allowed: boolean;
  hourStart: number;
  hour: number;
  dayStart: number;
  day: number;
  zone: string | undefined;
  /** The counter takes these bounds and zone even when the request is refused (its windows were of another zone). */
  moved: boolean;
} {
  let hourStart = request.hourStart;
  let dayStart = request.dayStart;
  let hour = 0;
  let day = 0;
  const zone = request.zone ?? stored?.zone;
  const moved = stored !== undefined && otherZone(stored, request.zone);
  if (stored && moved) {
    if (stored.hourStart + HOUR_SECONDS > hourStart) hour = stored.hour;
    if (stored.dayStart + DAY_SECONDS > dayStart) day = stored.day;
  } else if (stored) {
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
    return { allowed: false, hourStart, hour, dayStart, day, zone, moved };
  }
  return { allowed: true, hourStart, hour: hour + 1, dayStart, day: day + 1, zone, moved };
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
 * doubt and not yet taken back) when it was sent: of all its calls, or, for a call of one counter
 * (every call on a Cluster), of that counter's calls, the only ones whose receipts it holds.
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
 * had already moved it on) in front of the sending instance's own field (`rc:<instance>`), newest
 * first, and drops that instance's receipts older than its oldest unsettled call, which nothing
 * will ever take back (and any past RECEIPTS_KEPT): a receipt stays as long as the receipt ledger
 * may need it, and no other instance's calls touch it. A counter records the zone of its windows
 * (`tz`), and a refused request still moves it to another zone's bounds. A new day sets the
 * counter's expiry, which takes every field with it. A call that finds its own receipt in a counter
 * already ran there (the gateway's Redis clients never send a command twice, redis/connection.ts,
 * and an undo leaves a receipt with no units; this holds should one ever run twice all the same):
 * it counts nothing there, and its requests get the first run's answers, with the counter's counts
 * as they are now. A key that holds something else than a counter is left as it is, and its
 * requests are answered `-1, 0, 0` (the call's other counters count as ever).
 */
export const CONSUME_SCRIPT = `
local hsText, dsText = ARGV[1], ARGV[2]
local hs = tonumber(hsText)
local ds = tonumber(dsText)
local expireAt = ARGV[3]
local limits = ARGV[4]
local field = ARGV[5]
local seq = ARGV[6]
local oldest = tonumber(ARGV[7])
local zone = ARGV[8]
local seqNumber = tonumber(seq)
-- Of a counter's receipts of this instance (newest first), those that stay: those of calls from
-- the oldest unsettled one on, RECEIPTS_KEPT with this call's at most. (Newest first is the order
-- they ran in, which is nearly always the order they were sent in; a call redirected on a Cluster
-- may run behind later ones, so an older receipt can sit between two that stay.) And, when this
-- very call ran here before (run twice, or taken back since), the units its receipt records,
-- which is among those as the call is unsettled; nil when it did not.
local function receiptsKept(rc)
  local keep, kept, counted, from = 0, nil, nil, 1
  for _ = 2, ${RECEIPTS_KEPT} do
    local colon = string.find(rc, ':', from, true)
    if not colon then break end
    local stop = string.find(rc, ',', colon, true)
    local n = tonumber(string.sub(rc, from, colon - 1))
    if n >= oldest then
      if n == seqNumber then counted = tonumber(string.match(rc, '^%d+', colon + 1)) end
      if from == keep + 1 then keep = stop else kept = (kept or string.sub(rc, 1, keep)) .. string.sub(rc, from, stop) end
    end
    if stop == #rc then break end
    from = stop + 1
  end
  return kept or string.sub(rc, 1, keep), counted
end
-- A request of a call that already ran on this counter: the first run's answer, counting nothing.
-- A row's requests are all shadow (force) or none, so the allowed ones were the first c.counted.
local function answerAgain(c, force)
  if force == '1' or c.counted > 0 then
    c.counted = math.max(c.counted - 1, 0)
    return 1, c.hc - c.counted, c.dc - c.counted
  end
  return 0, c.hc, c.dc
end
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
    local v = redis.pcall('HMGET', key, 'hs', 'hc', 'ds', 'dc', field, 'tz')
    if v.err then
      -- A key that holds something else than a counter (written by another program): its
      -- requests are answered -1 and it is left as it is; the call's other counters count.
      c = { counted = 0, other = true, added = 0 }
    else
      c = { hs = tonumber(v[1]), hc = tonumber(v[2]) or 0, ds = tonumber(v[3]), dc = tonumber(v[4]) or 0, rc = v[5] or '', tz = v[6] or nil, added = 0 }
      c.storedTz = c.tz
      -- When this call ran here before, the units of that run are all it counts. (Set only then: a
      -- ninth field makes Lua rebuild the table larger, 3 % of Redis's work; docs/performance.md, change 15.)
      local rc, counted = receiptsKept(c.rc)
      c.rc = rc
      if counted then c.counted = counted end
    end
    counters[key] = c
    order[#order + 1] = key
  end
  local allowed, hc, dc
  if c.counted then
    -- (The key of another type rides on this test, not on one of its own for every request.)
    if c.other then allowed, hc, dc = -1, 0, 0 else allowed, hc, dc = answerAgain(c, force) end
  else
    -- countStep, on the counter as this call has it so far.
    hc, dc = c.hc, c.dc
    local moved = zone ~= '' and c.tz and c.tz ~= zone
    if moved then
      if not c.hs or c.hs + ${HOUR_SECONDS} <= hs then hc = 0 end
      if not c.ds or c.ds + ${DAY_SECONDS} <= ds then dc = 0 end
    else
      if not c.hs or c.hs < hs then hc = 0 end
      if not c.ds or c.ds < ds then dc = 0 end
    end
    if force ~= '1' and (hc >= tonumber(hourLimit) or dc >= tonumber(dayLimit)) then
      allowed = 0
      -- Refused, but the counter moves to the new zone's bounds all the same: its next window starts afresh.
      if moved then
        c.hs, c.ds, c.hc, c.dc, c.tz, c.newDay, c.moved = hs, ds, hc, dc, zone, true, true
      end
    else
      allowed = 1
      if moved then
        c.hs, c.ds, c.newDay = hs, ds, true
      else
        if not c.hs or c.hs < hs then c.hs = hs; c.newHour = true end
        if not c.ds or c.ds < ds then c.ds = ds; c.newDay = true end
      end
      if zone ~= '' then c.tz = zone end
      hc = hc + 1
      dc = dc + 1
      c.hc, c.dc = hc, dc
      c.added = c.added + 1
    end
  end
  out[#out + 1] = allowed
  out[#out + 1] = hc
  out[#out + 1] = dc
end
for _, key in ipairs(order) do
  local c = counters[key]
  if c.added > 0 then
    -- Bounds that are the call's are written as the call's text: a number costs a formatting each
    -- time it is written, in the receipt and in HSET (docs/performance.md, change 15).
    local hsOut = c.hs == hs and hsText or c.hs
    local dsOut = c.ds == ds and dsText or c.ds
    local rc = seq .. ':' .. c.added .. ':' .. hsOut .. ':' .. dsOut .. ',' .. c.rc
    -- One write; the zone only when it changed (a new table's zone, or a counter's first).
    if c.tz ~= c.storedTz then
      redis.call('HSET', key, 'hs', hsOut, 'hc', c.hc, 'ds', dsOut, 'dc', c.dc, field, rc, 'tz', c.tz)
    elseif c.newHour or c.newDay then
      redis.call('HSET', key, 'hs', hsOut, 'hc', c.hc, 'ds', dsOut, 'dc', c.dc, field, rc)
    else
      -- Neither window moved: only what changed.
      redis.call('HSET', key, 'hc', c.hc, 'dc', c.dc, field, rc)
    end
    if c.newDay then redis.call('PEXPIREAT', key, expireAt) end
  elseif c.moved then
    redis.call('HSET', key, 'hs', c.hs, 'hc', c.hc, 'ds', c.ds, 'dc', c.dc, 'tz', c.tz)
    redis.call('PEXPIREAT', key, expireAt)
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
  const { hourStart, dayStart, expireAt, zone } = (items[0] as { readonly request: ConsumeRequest }).request;
  let limits = '';
  for (const { request: r } of items) limits += r.hourLimit + ',' + r.dayLimit + (r.force ? ',1,' : ',0,');
  out.push(hourStart, dayStart, expireAt, limits, receipt.field, receipt.seq, receipt.oldestUnsettled, zone ?? '');
}

/**
 * Units counted elsewhere (docs/operations.md "Redis": the outage's admissions end up in
 * Redis): units of a window the counter is still in are added; a window the counter has not
 * reached yet starts with them; a window the counter has already left behind (another instance
 * started the next one) is not touched, since those units belong to a window that is over.
 */
export function mergeStep(stored: StoredCounter | undefined, entry: MergeEntry): StoredCounter {
  let { hourStart, hour, dayStart, day } = entry;
  let zone = entry.zone ?? stored?.zone;
  if (stored && otherZone(stored, entry.zone)) {
    // Windows of two zones: those that overlap are one, in the counter's bounds; the zone is the day's.
    [hourStart, hour] = acrossZones(stored.hourStart, stored.hour, hourStart, hour, HOUR_SECONDS);
    [dayStart, day] = acrossZones(stored.dayStart, stored.day, dayStart, day, DAY_SECONDS);
    if (dayStart === stored.dayStart) zone = stored.zone;
  } else if (stored) {
    if (stored.hourStart > hourStart) ({ hourStart, hour } = stored);
    else if (stored.hourStart === hourStart) hour += stored.hour;
    if (stored.dayStart > dayStart) ({ dayStart, day } = stored);
    else if (stored.dayStart === dayStart) day += stored.day;
  }
  return { hourStart, hour, dayStart, day, zone };
}

/** A window of the counter and one of an entry in another zone: added up when they overlap, else the later one. */
function acrossZones(
  storedStart: number,
  storedUnits: number,
  start: number,
  units: number,
  length: number,
): [number, number] {
  if (storedStart + length <= start) return [start, units];
  if (start + length <= storedStart) return [storedStart, storedUnits];
  return [storedStart, storedUnits + units];
}

/** Arguments per merged counter: hourStart, hour, dayStart, day, expireAt, zone (see mergeArgs). */
const ARGS_PER_MERGE = 6;

/**
 * mergeStep in Lua, for distinct counters. KEYS: the counters; ARGV: the caller's mark field and
 * the call's number, then mergeArgs of each counter. A counter whose mark is already at that
 * number or past it is left as it is (a call sent again after its answer was lost: see
 * redis/outage-merge.ts); the others get the mark. A counter whose day is new gets the entry's
 * expiry; receipts (`rc:*`) are left as they are, so the calls they name can still be taken
 * back. A key that holds something else than a counter is left as it is. Answers the positions
 * (from 1) of those keys.
 */
export const MERGE_SCRIPT = `
local mark, seq = ARGV[1], tonumber(ARGV[2])
local other = {}
for i = 1, #KEYS do
  local a = 2 + (i - 1) * ${ARGS_PER_MERGE}
  local v = redis.pcall('HMGET', KEYS[i], 'hs', 'hc', 'ds', 'dc', 'tz', mark)
  if v.err then
    other[#other + 1] = i
  elseif not (v[6] and tonumber(v[6]) >= seq) then
    local hs, hc = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    local ds, dc = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
    local zone = ARGV[a + 6]
    local shs, sds, stz = tonumber(v[1]), tonumber(v[3]), v[5] or nil
    local newDay = not sds or sds < ds
    if shs and sds and zone ~= '' and stz and stz ~= zone then
      -- Windows of two zones: those that overlap are one, in the counter's bounds; the zone is the day's.
      newDay = false
      if hs + ${HOUR_SECONDS} <= shs then hs, hc = shs, tonumber(v[2]) or 0
      elseif shs + ${HOUR_SECONDS} > hs then hs, hc = shs, hc + (tonumber(v[2]) or 0) end
      if sds + ${DAY_SECONDS} <= ds then newDay = true
      elseif ds + ${DAY_SECONDS} <= sds then ds, dc, zone = sds, tonumber(v[4]) or 0, stz
      else ds, dc, zone = sds, dc + (tonumber(v[4]) or 0), stz end
    else
      if shs and shs > hs then hs, hc = shs, tonumber(v[2]) or 0 elseif shs == hs then hc = hc + (tonumber(v[2]) or 0) end
      if sds and sds > ds then ds, dc = sds, tonumber(v[4]) or 0 elseif sds == ds then dc = dc + (tonumber(v[4]) or 0) end
      if zone == '' then zone = stz end
    end
    if zone and zone ~= stz then
      redis.call('HSET', KEYS[i], 'hs', hs, 'hc', hc, 'ds', ds, 'dc', dc, 'tz', zone, mark, seq)
    else
      redis.call('HSET', KEYS[i], 'hs', hs, 'hc', hc, 'ds', ds, 'dc', dc, mark, seq)
    end
    if newDay then redis.call('PEXPIREAT', KEYS[i], ARGV[a + 5]) end
  end
end
return other
`;

/** The ARGV of one entry in a MERGE_SCRIPT call. */
export function mergeArgs(e: MergeEntry): Array<number | string> {
  return [e.hourStart, e.hour, e.dayStart, e.day, e.expireAt, e.zone ?? ''];
}

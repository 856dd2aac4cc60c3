// Backoff: jittered, growing, capped — so clients cut off together do not come back together.
import {test} from "node:test";
import assert from "node:assert/strict";

import {Backoff} from "../../chamvi_runs/static/chamvi_runs/client.js";

function seeded(seed) {
  // A small LCG: repeatable jitter across the whole [0, 1) range.
  let x = seed;
  return () => ((x = (x * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
}

test("each delay lies within [ceiling/2, ceiling]; ceilings double from initial and cap at max", () => {
  for (const seed of [1, 7, 42, 1234]) {
    const backoff = new Backoff({initial: 500, max: 15000, random: seeded(seed)});
    const ceilings = [500, 1000, 2000, 4000, 8000, 15000, 15000, 15000, 15000, 15000];
    for (const ceiling of ceilings) {
      const delay = backoff.next();
      assert.ok(delay >= ceiling / 2 && delay <= ceiling, `seed ${seed}: ${delay} not in [${ceiling / 2}, ${ceiling}]`);
    }
  }
});

test("the extremes of the jitter: half the ceiling and the whole of it", () => {
  const low = new Backoff({initial: 100, max: 1000, random: () => 0});
  assert.deepEqual(Array.from({length: 6}, () => low.next()), [50, 100, 200, 400, 500, 500]);
  const high = new Backoff({initial: 100, max: 1000, random: () => 0.999999});
  assert.deepEqual(Array.from({length: 6}, () => high.next()), [100, 200, 400, 800, 1000, 1000]);
});

test("the jitter spreads clients: delays of one ceiling differ across random draws", () => {
  const delays = new Set();
  for (const seed of [3, 5, 8, 13, 21, 34, 55, 89]) delays.add(new Backoff({initial: 1000, random: seeded(seed)}).next());
  assert.ok(delays.size >= 4, `only ${[...delays]}`);
});

test("reset() starts over from initial; defaults are 500 ms to 15 s", () => {
  const backoff = new Backoff({random: () => 0.999999});
  backoff.next();
  backoff.next();
  assert.equal(backoff.next(), 2000);
  backoff.reset();
  assert.equal(backoff.next(), 500);
  for (let n = 0; n < 2000; n++) backoff.next();  // 2^n overflows to Infinity: still capped
  assert.equal(backoff.next(), 15000);
});

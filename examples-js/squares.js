// A wasmproc process in JavaScript, built with componentize-js against `wit/` (world
// `process`): the same fan-out as `examples-python/squares.py`. It spawns children of its
// own component and gathers their results from their exit events.
//
// Entries:
// - `main`: input `n` (JSON); spawns `n` children running `square` with inputs 0..n-1,
//   monitored, collects each child's result from its exit event, sleeps 1 ms, and
//   completes with the squares in input order, as JSON. Its first step yields all `n`
//   spawns and its sleep at once, so `n + 1` must not pass the host's limit of commands a step
//   (`--max-yields`, 1,024);
// - `square`: input `i` (JSON); completes at once with `i * i`;
// - `idle`: waits (status `idle`) for the first message, then completes with its body;
// - `fail`: input `message` (JSON); ends at once with the error `message`;
// - `watch`: input `message` (JSON); spawns, monitored, an `idle` child and a `fail` child
//   (with `message`), terminates the `idle` one, and completes with how each ended, as
//   the typed exit reasons of their exit events say: `{"idle": ["terminated"], "fail":
//   ["error", message]}`;
// - `trap`: input `message` (JSON); traps exits, spawns a `fail` child (with `message`)
//   linked and not monitored, and completes with the exit event of the link:
//   `{"child": true, "linked": true, "reason": ["error", message]}`;
// - `linked`: input `message` (JSON); spawns a `fail` child (with `message`) linked,
//   without trapping exits, and waits: the child's error ends it;
// - `supervise`: input `kind` (JSON), the kind this component is registered under (`app`
//   in `wasmproc run`); starts the host's built-in supervisor (kind `supervisor`, method
//   `start`, the spec as JSON) over one `fail` child that ends at once, restarted with a
//   backoff until the supervisor gives up at its intensity, and completes with the
//   supervisor's exit reason, which names the child: `["error", "restart intensity
//   reached: …"]`.
//
// A component runs one process per instance, so the process's state is a module global.
// WIT types as componentize-js gives them: u64 is a BigInt, list<u8> a Uint8Array, a
// variant `{ tag, val }`, a result `{ tag: 'ok' | 'err', val }`; an exported function
// returning `result<_, string>` fails by throwing.

import { log, wait } from 'wasmproc:process/host@0.2.1';

const ENTRIES = ['main', 'square', 'idle', 'fail', 'watch', 'trap', 'linked', 'supervise'];

// The tag of the one sleep; spawn tags are 1 + the child's index.
const SLEEP_TAG = 0n;

let state = null;

function payload(value) {
  return { format: 'json', data: new TextEncoder().encode(JSON.stringify(value)) };
}

function decode(p) {
  if (p.format !== 'json') {
    throw new Error(`expected a \`json\` payload, got \`${p.format}\``);
  }
  return JSON.parse(new TextDecoder().decode(p.data));
}

function output(status, yields = []) {
  return { status, yields };
}

function complete(value) {
  return output({ tag: 'complete', val: { tag: 'ok', val: payload(value) } });
}

function fail(message) {
  return output({ tag: 'complete', val: { tag: 'err', val: message } });
}

/// The pid in a spawn's completion: 8 little-endian bytes.
function pidOf(data) {
  return new DataView(data.buffer, data.byteOffset, data.byteLength).getBigUint64(0, true);
}

// Spawns the children in its first step, then waits for every exit and the sleep.
class Main {
  constructor(n) {
    if (!Number.isInteger(n) || n < 0) {
      throw new Error(`\`main\` takes a count of children, got ${JSON.stringify(n)}`);
    }
    this.n = n;
    this.started = false;
    this.pids = new Map(); // child pid -> index
    this.early = new Map(); // child pid -> result payload, for exits before the pid's spawn completed
    this.results = new Array(n).fill(null);
    this.pending = n;
    this.slept = false;
  }

  step(events) {
    if (!this.started) {
      this.started = true;
      log('info', `spawning ${this.n} children`);
      const yields = [];
      for (let i = 0; i < this.n; i++) {
        const request = { kind: undefined, method: 'square', input: [payload(i)], monitor: true, link: false };
        yields.push({ tag: BigInt(i + 1), command: { tag: 'spawn', val: request } });
      }
      yields.push({ tag: SLEEP_TAG, command: { tag: 'sleep', val: 1_000_000n } });
      return output({ tag: 'blocked' }, yields);
    }
    // A child's exit can come before the completion that names its pid (in the same
    // batch, or even an earlier one): exits of pids not known yet wait in `early`.
    for (const event of events) {
      switch (event.tag) {
        case 'completion': {
          const { tag, result } = event.val;
          if (result.tag === 'err') {
            return fail(`command ${tag} failed: ${result.val}`);
          }
          if (tag === SLEEP_TAG) {
            this.slept = true;
          } else {
            const pid = pidOf(result.val.data);
            this.pids.set(pid, Number(tag) - 1);
            if (this.early.has(pid)) {
              this.finish(pid, this.early.get(pid));
              this.early.delete(pid);
            }
          }
          break;
        }
        case 'exit': {
          const { pid, reason } = event.val;
          if (reason.tag !== 'normal') {
            return fail(`child ${pid} ${describe(reason)}`);
          }
          if (this.pids.has(pid)) {
            this.finish(pid, reason.val);
          } else {
            this.early.set(pid, reason.val);
          }
          break;
        }
        case 'cancel':
          return fail(`cancelled: ${event.val}`);
        default:
          break;
      }
    }
    if (this.pending === 0 && this.slept) {
      return complete(this.results);
    }
    return output({ tag: 'blocked' });
  }

  finish(pid, result) {
    this.results[this.pids.get(pid)] = decode(result);
    this.pending -= 1;
  }
}

// An abnormal exit reason as the end of a sentence, as the host words it.
function describe(reason) {
  switch (reason.tag) {
    case 'error':
      return `returned an error: ${reason.val}`;
    case 'trap':
      return `trapped: ${reason.val.kind}: ${reason.val.message}`;
    case 'noconnection':
      return `was lost with its node (noconnection: ${reason.val})`;
    case 'killed':
      return 'was killed';
    case 'shutdown':
      return 'was shut down';
    case 'terminated':
      return 'was terminated';
    case 'noproc':
      return 'did not exist (noproc)';
    default:
      return 'ended abnormally';
  }
}

// A typed exit reason as JSON: its name, then what it carries.
function reasonJson(reason) {
  switch (reason.tag) {
    case 'normal':
      return ['normal', decode(reason.val)];
    case 'error':
    case 'noconnection':
      return [reason.tag, reason.val];
    case 'trap':
      return ['trap', reason.val.kind, reason.val.message];
    default:
      return [reason.tag];
  }
}

class Fail {
  constructor(message) {
    this.message = String(message);
  }

  step(_events) {
    return fail(this.message);
  }
}

const IDLE = 1n;
const FAIL = 2n;
const TERMINATE = 3n;

// Spawns `idle` and `fail` children, terminates the first, and reports both exits.
class Watch {
  constructor(message) {
    this.message = message;
    this.started = false;
    this.methods = new Map(); // child pid -> its method
    this.exits = new Map(); // child pid -> its reason, as JSON
  }

  step(events) {
    if (!this.started) {
      this.started = true;
      const spawn = (tag, method, value) => ({
        tag,
        command: {
          tag: 'spawn',
          val: { kind: undefined, method, input: [payload(value)], monitor: true, link: false },
        },
      });
      return output({ tag: 'blocked' }, [spawn(IDLE, 'idle', null), spawn(FAIL, 'fail', this.message)]);
    }
    const yields = [];
    for (const event of events) {
      if (event.tag === 'completion') {
        const { tag, result } = event.val;
        if (result.tag === 'err') {
          return fail(`command ${tag} failed: ${result.val}`);
        }
        if (tag === IDLE || tag === FAIL) {
          const pid = pidOf(result.val.data);
          this.methods.set(pid, tag === IDLE ? 'idle' : 'fail');
          if (tag === IDLE) {
            yields.push({ tag: TERMINATE, command: { tag: 'terminate', val: pid } });
          }
        }
      } else if (event.tag === 'exit') {
        this.exits.set(event.val.pid, reasonJson(event.val.reason));
      } else if (event.tag === 'cancel') {
        return fail(`cancelled: ${event.val}`);
      }
    }
    if (this.exits.size === 2 && this.methods.size === 2) {
      const ended = {};
      for (const [pid, reason] of this.exits) {
        ended[this.methods.get(pid)] = reason;
      }
      return complete(ended);
    }
    return output({ tag: 'blocked' }, yields);
  }
}

const TRAP_EXITS = 1n;
const SPAWN = 2n;

// Traps exits, spawns a linked `fail` child, and reports the link's exit event.
class Trap {
  constructor(message) {
    this.message = message;
    this.started = false;
    this.child = null;
    this.exit = null;
  }

  step(events) {
    if (!this.started) {
      this.started = true;
      const request = { kind: undefined, method: 'fail', input: [payload(this.message)], monitor: false, link: true };
      return output({ tag: 'blocked' }, [
        { tag: TRAP_EXITS, command: { tag: 'trap-exits', val: true } },
        { tag: SPAWN, command: { tag: 'spawn', val: request } },
      ]);
    }
    for (const event of events) {
      if (event.tag === 'completion') {
        const { tag, result } = event.val;
        if (result.tag === 'err') {
          return fail(`command ${tag} failed: ${result.val}`);
        }
        if (tag === SPAWN) {
          this.child = pidOf(result.val.data);
        }
      } else if (event.tag === 'exit') {
        this.exit = event.val;
      } else if (event.tag === 'cancel') {
        return fail(`cancelled: ${event.val}`);
      }
    }
    if (this.child !== null && this.exit !== null) {
      return complete({
        child: this.exit.pid === this.child,
        linked: this.exit.linked,
        reason: reasonJson(this.exit.reason),
      });
    }
    return output({ tag: 'blocked' });
  }
}

// Spawns a linked `fail` child and waits: the child's error ends this process.
class Linked {
  constructor(message) {
    this.message = message;
    this.started = false;
  }

  step(events) {
    if (!this.started) {
      this.started = true;
      const request = { kind: undefined, method: 'fail', input: [payload(this.message)], monitor: false, link: true };
      return output({ tag: 'idle' }, [{ tag: SPAWN, command: { tag: 'spawn', val: request } }]);
    }
    for (const event of events) {
      if (event.tag === 'cancel') {
        return fail(`cancelled: ${event.val}`);
      }
    }
    return output({ tag: 'idle' });
  }
}

// Starts a supervisor over a child in a crash loop and reports how the supervisor ends.
class Supervise {
  constructor(kind) {
    if (typeof kind !== 'string') {
      throw new Error(`\`supervise\` takes the kind of this component, got ${JSON.stringify(kind)}`);
    }
    this.kind = kind;
    this.started = false;
  }

  step(events) {
    if (!this.started) {
      this.started = true;
      const spec = {
        strategy: 'one_for_one',
        intensity: 2,
        period: '1m',
        backoff: { initial: '1ms', max: '10ms', jitter: 0.5 },
        children: [{ id: 'crasher', kind: this.kind, method: 'fail', input: ['boom'], restart: 'permanent' }],
      };
      const request = { kind: 'supervisor', method: 'start', input: [payload(spec)], monitor: true, link: false };
      return output({ tag: 'blocked' }, [{ tag: SPAWN, command: { tag: 'spawn', val: request } }]);
    }
    for (const event of events) {
      if (event.tag === 'completion' && event.val.result.tag === 'err') {
        return fail(`the supervisor did not start: ${event.val.result.val}`);
      }
      if (event.tag === 'exit') {
        // The only process this one monitors is its supervisor.
        return complete(reasonJson(event.val.reason));
      }
      if (event.tag === 'cancel') {
        return fail(`cancelled: ${event.val}`);
      }
    }
    return output({ tag: 'blocked' });
  }
}

class Square {
  constructor(i) {
    if (!Number.isInteger(i)) {
      throw new Error(`\`square\` takes an integer, got ${JSON.stringify(i)}`);
    }
    this.i = i;
  }

  step(_events) {
    return complete(this.i * this.i);
  }
}

class Idle {
  step(events) {
    for (const event of events) {
      if (event.tag === 'message') {
        return output({ tag: 'complete', val: { tag: 'ok', val: event.val.body } });
      }
      if (event.tag === 'cancel') {
        return fail(`cancelled: ${event.val}`);
      }
    }
    return output({ tag: 'idle' });
  }
}

export function entries() {
  return ENTRIES;
}

export function init(_pid, method, input) {
  const entry = {
    main: Main,
    square: Square,
    idle: Idle,
    fail: Fail,
    watch: Watch,
    trap: Trap,
    linked: Linked,
    supervise: Supervise,
  }[method];
  if (entry === undefined) {
    // The host adds the list of entries.
    throw `unknown entry method \`${method}\``;
  }
  if (input.length === 0) {
    throw `\`${method}\` takes one JSON input, got none`;
  }
  try {
    state = new entry(decode(input[0]));
  } catch (error) {
    throw String(error.message ?? error);
  }
}

// While the process has more to do it stays in this call: each step ends in the host's
// `wait`, which answers with the next step's events (`undefined`: return now, with no
// yields).
export function step(events) {
  for (;;) {
    const out = state.step(events);
    if (out.status.tag === 'complete') {
      return out;
    }
    const next = wait(out);
    if (next === undefined) {
      return output(out.status);
    }
    events = next;
  }
}

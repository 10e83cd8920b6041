"""A wasmproc process in Python, built with componentize-py against `wit/` (world
`process`): a fan-out that spawns children of its own component and gathers their
results from their exit events.

Entries:
- `main`: input `n` (JSON); spawns `n` children running `square` with inputs 0..n-1,
  monitored, collects each child's result from its exit event, sleeps 1 ms, and
  completes with the squares in input order, as JSON. Its first step yields all `n`
  spawns and its sleep at once, so `n + 1` must not pass the host's limit of commands a step
  (`--max-yields`, 1,024);
- `square`: input `i` (JSON); completes at once with `i * i`;
- `idle`: waits (status `idle`) for the first message, then completes with its body;
- `fail`: input `message` (JSON); ends at once with the error `message`;
- `watch`: input `message` (JSON); spawns, monitored, an `idle` child and a `fail` child
  (with `message`), terminates the `idle` one, and completes with how each ended, as the
  typed exit reasons of their exit events say: `{"idle": ["terminated"], "fail":
  ["error", message]}`;
- `trap`: input `message` (JSON); traps exits, spawns a `fail` child (with `message`)
  linked and not monitored, and completes with the exit event of the link:
  `{"child": true, "linked": true, "reason": ["error", message]}`;
- `linked`: input `message` (JSON); spawns a `fail` child (with `message`) linked,
  without trapping exits, and waits: the child's error ends it;
- `supervise`: input `kind` (JSON), the kind this component is registered under (`app`
  in `wasmproc run`); starts the host's built-in supervisor (kind `supervisor`, method
  `start`, the spec as JSON) over one `fail` child that ends at once, restarted with a
  backoff until the supervisor gives up at its intensity, and completes with the
  supervisor's exit reason, which names the child: `["error", "restart intensity
  reached: …"]`.

A component runs one process per instance, so the process's state is a module global.
"""

import json

import wit_world
from componentize_py_types import Err, Ok
from wit_world.imports import host, types

ENTRIES = ["main", "square", "idle", "fail", "watch", "trap", "linked", "supervise"]

# The tag of the one sleep; spawn tags are 1 + the child's index.
SLEEP_TAG = 0

state = None


def payload(value):
    return types.Payload(format="json", data=json.dumps(value, separators=(",", ":")).encode())


def decode(p):
    if p.format != "json":
        raise ValueError(f"expected a `json` payload, got `{p.format}`")
    return json.loads(p.data)


def output(status, yields=()):
    return types.StepOutput(status=status, yields=list(yields))


def complete(value):
    return output(types.Status_Complete(Ok(payload(value))))


def fail(message):
    return output(types.Status_Complete(Err(message)))


class Main:
    """Spawns the children in its first step, then waits for every exit and the sleep."""

    def __init__(self, n):
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"`main` takes a count of children, got {n!r}")
        self.n = n
        self.started = False
        self.pids = {}  # child pid -> index
        self.early = {}  # child pid -> result payload, for exits before the pid's spawn completed
        self.results = [None] * n
        self.pending = n
        self.slept = False

    def step(self, events):
        if not self.started:
            self.started = True
            host.log(host.Level.INFO, f"spawning {self.n} children")
            spawns = [
                types.YieldCommand(
                    tag=1 + i,
                    command=types.Command_Spawn(
                        types.SpawnRequest(kind=None, method="square", input=[payload(i)], monitor=True, link=False)
                    ),
                )
                for i in range(self.n)
            ]
            sleep = types.YieldCommand(tag=SLEEP_TAG, command=types.Command_Sleep(1_000_000))
            return output(types.Status_Blocked(), spawns + [sleep])
        # A child's exit can come before the completion that names its pid (in the same
        # batch, or even an earlier one): exits of pids not known yet wait in `early`.
        for event in events:
            if isinstance(event, types.Event_Completion):
                completion = event.value
                if isinstance(completion.result, Err):
                    return fail(f"command {completion.tag} failed: {completion.result.value}")
                if completion.tag == SLEEP_TAG:
                    self.slept = True
                else:
                    pid = int.from_bytes(completion.result.value.data, "little")
                    self.pids[pid] = completion.tag - 1
                    if pid in self.early:
                        self.finish(pid, self.early.pop(pid))
            elif isinstance(event, types.Event_Exit):
                exit = event.value
                if not isinstance(exit.reason, types.ExitReason_Normal):
                    return fail(f"child {exit.pid} {describe(exit.reason)}")
                if exit.pid in self.pids:
                    self.finish(exit.pid, exit.reason.value)
                else:
                    self.early[exit.pid] = exit.reason.value
            elif isinstance(event, types.Event_Cancel):
                return fail(f"cancelled: {event.value}")
        if self.pending == 0 and self.slept:
            return complete(self.results)
        return output(types.Status_Blocked())

    def finish(self, pid, result):
        self.results[self.pids[pid]] = decode(result)
        self.pending -= 1


def describe(reason):
    """An abnormal exit reason as the end of a sentence, as the host words it."""
    if isinstance(reason, types.ExitReason_Error):
        return f"returned an error: {reason.value}"
    if isinstance(reason, types.ExitReason_Trap):
        kind = reason.value.kind.name.lower().replace("_", "-")
        return f"trapped: {kind}: {reason.value.message}"
    if isinstance(reason, types.ExitReason_Noconnection):
        return f"was lost with its node (noconnection: {reason.value})"
    names = {
        types.ExitReason_Killed: "was killed",
        types.ExitReason_Shutdown: "was shut down",
        types.ExitReason_Terminated: "was terminated",
        types.ExitReason_Noproc: "did not exist (noproc)",
    }
    return names.get(type(reason), "ended abnormally")


def reason_json(reason):
    """A typed exit reason as JSON: its name, then what it carries."""
    if isinstance(reason, types.ExitReason_Normal):
        return ["normal", decode(reason.value)]
    if isinstance(reason, (types.ExitReason_Error, types.ExitReason_Noconnection)):
        return [type(reason).__name__.removeprefix("ExitReason_").lower(), reason.value]
    if isinstance(reason, types.ExitReason_Trap):
        return ["trap", reason.value.kind.name.lower().replace("_", "-"), reason.value.message]
    return [type(reason).__name__.removeprefix("ExitReason_").lower()]


class Fail:
    def __init__(self, message):
        self.message = str(message)

    def step(self, events):
        return fail(self.message)


class Watch:
    """Spawns `idle` and `fail` children, terminates the first, and reports both exits."""

    IDLE, FAIL, TERMINATE = 1, 2, 3

    def __init__(self, message):
        self.message = message
        self.started = False
        self.methods = {}  # child pid -> its method
        self.exits = {}  # child pid -> its reason, as JSON
        self.idle = None

    def step(self, events):
        if not self.started:
            self.started = True
            spawn = lambda tag, method, value: types.YieldCommand(
                tag=tag,
                command=types.Command_Spawn(
                    types.SpawnRequest(kind=None, method=method, input=[payload(value)], monitor=True, link=False)
                ),
            )
            return output(types.Status_Blocked(), [spawn(self.IDLE, "idle", None), spawn(self.FAIL, "fail", self.message)])
        yields = []
        for event in events:
            if isinstance(event, types.Event_Completion):
                completion = event.value
                if isinstance(completion.result, Err):
                    return fail(f"command {completion.tag} failed: {completion.result.value}")
                if completion.tag in (self.IDLE, self.FAIL):
                    pid = int.from_bytes(completion.result.value.data, "little")
                    self.methods[pid] = "idle" if completion.tag == self.IDLE else "fail"
                    if completion.tag == self.IDLE:
                        yields.append(types.YieldCommand(tag=self.TERMINATE, command=types.Command_Terminate(pid)))
            elif isinstance(event, types.Event_Exit):
                self.exits[event.value.pid] = reason_json(event.value.reason)
            elif isinstance(event, types.Event_Cancel):
                return fail(f"cancelled: {event.value}")
        if len(self.exits) == 2 and len(self.methods) == 2:
            return complete({self.methods[pid]: reason for pid, reason in self.exits.items()})
        return output(types.Status_Blocked(), yields)


class Trap:
    """Traps exits, spawns a linked `fail` child, and reports the link's exit event."""

    TRAP, SPAWN = 1, 2

    def __init__(self, message):
        self.message = message
        self.started = False
        self.child = None
        self.exit = None

    def step(self, events):
        if not self.started:
            self.started = True
            request = types.SpawnRequest(kind=None, method="fail", input=[payload(self.message)], monitor=False, link=True)
            return output(
                types.Status_Blocked(),
                [
                    types.YieldCommand(tag=self.TRAP, command=types.Command_TrapExits(True)),
                    types.YieldCommand(tag=self.SPAWN, command=types.Command_Spawn(request)),
                ],
            )
        for event in events:
            if isinstance(event, types.Event_Completion):
                completion = event.value
                if isinstance(completion.result, Err):
                    return fail(f"command {completion.tag} failed: {completion.result.value}")
                if completion.tag == self.SPAWN:
                    self.child = int.from_bytes(completion.result.value.data, "little")
            elif isinstance(event, types.Event_Exit):
                self.exit = event.value
            elif isinstance(event, types.Event_Cancel):
                return fail(f"cancelled: {event.value}")
        if self.child is not None and self.exit is not None:
            return complete(
                {
                    "child": self.exit.pid == self.child,
                    "linked": self.exit.linked,
                    "reason": reason_json(self.exit.reason),
                }
            )
        return output(types.Status_Blocked())


class Linked:
    """Spawns a linked `fail` child and waits: the child's error ends this process."""

    def __init__(self, message):
        self.message = message
        self.started = False

    def step(self, events):
        if not self.started:
            self.started = True
            request = types.SpawnRequest(kind=None, method="fail", input=[payload(self.message)], monitor=False, link=True)
            return output(types.Status_Idle(), [types.YieldCommand(tag=1, command=types.Command_Spawn(request))])
        for event in events:
            if isinstance(event, types.Event_Cancel):
                return fail(f"cancelled: {event.value}")
        return output(types.Status_Idle())


class Supervise:
    """Starts a supervisor over a child in a crash loop and reports how the supervisor ends."""

    SPAWN = 1

    def __init__(self, kind):
        if not isinstance(kind, str):
            raise ValueError(f"`supervise` takes the kind of this component, got {kind!r}")
        self.kind = kind
        self.started = False

    def step(self, events):
        if not self.started:
            self.started = True
            spec = {
                "strategy": "one_for_one",
                "intensity": 2,
                "period": "1m",
                "backoff": {"initial": "1ms", "max": "10ms", "jitter": 0.5},
                "children": [
                    {"id": "crasher", "kind": self.kind, "method": "fail", "input": ["boom"], "restart": "permanent"}
                ],
            }
            request = types.SpawnRequest(kind="supervisor", method="start", input=[payload(spec)], monitor=True, link=False)
            return output(types.Status_Blocked(), [types.YieldCommand(tag=self.SPAWN, command=types.Command_Spawn(request))])
        for event in events:
            if isinstance(event, types.Event_Completion):
                completion = event.value
                if isinstance(completion.result, Err):
                    return fail(f"the supervisor did not start: {completion.result.value}")
            elif isinstance(event, types.Event_Exit):
                # The only process this one monitors is its supervisor.
                return complete(reason_json(event.value.reason))
            elif isinstance(event, types.Event_Cancel):
                return fail(f"cancelled: {event.value}")
        return output(types.Status_Blocked())


class Square:
    def __init__(self, i):
        if not isinstance(i, int):
            raise ValueError(f"`square` takes an integer, got {i!r}")
        self.i = i

    def step(self, events):
        return complete(self.i * self.i)


class Idle:
    def __init__(self, _input):
        pass

    def step(self, events):
        for event in events:
            if isinstance(event, types.Event_Message):
                return output(types.Status_Complete(Ok(event.value.body)))
            if isinstance(event, types.Event_Cancel):
                return fail(f"cancelled: {event.value}")
        return output(types.Status_Idle())


class WitWorld(wit_world.WitWorld):
    def entries(self):
        return ENTRIES

    def init(self, pid, method, input):
        global state
        entry = {
            "main": Main,
            "square": Square,
            "idle": Idle,
            "fail": Fail,
            "watch": Watch,
            "trap": Trap,
            "linked": Linked,
            "supervise": Supervise,
        }.get(method)
        if entry is None:
            # The host adds the list of entries.
            raise Err(f"unknown entry method `{method}`")
        if not input:
            raise Err(f"`{method}` takes one JSON input, got none")
        try:
            state = entry(decode(input[0]))
        except ValueError as error:
            raise Err(str(error))

    def step(self, events):
        # While the process has more to do it stays in this call: each step ends in the
        # host's `wait`, which answers with the next step's events (`None`: return now,
        # with no yields).
        while True:
            out = state.step(events)
            if isinstance(out.status, types.Status_Complete):
                return out
            events = host.wait(out)
            if events is None:
                return output(out.status)

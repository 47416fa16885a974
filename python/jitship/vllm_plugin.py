"""jitship as a vLLM general plugin: installs the caches before vLLM compiles, publishes what it
compiled. Registered as `jitship = jitship.vllm_plugin:register` under the `vllm.general_plugins`
entry point group, which vLLM loads with `vllm.plugins.load_general_plugins()` in every process it
starts (the front end, the engine core, each worker), early: when it builds its engine arguments
(EngineArgs.__post_init__, add_cli_args), before any model is loaded or compiled.

What `register` does, in the first process of a vLLM worker only (its children inherit
JITSHIP_VLLM_PLUGIN_PID and do nothing):
1. Nothing at all unless a store is configured: JITSHIP_STORE is set, or JITSHIP_CONFIG names a
   file with a [store] table. JITSHIP_VLLM_PLUGIN=0 turns the plugin off, and it stands down by
   itself under `jitship run` (an ancestor process `jitship run ...`), which does the same work
   around the whole server.
2. `jitship install --engine vllm --best-effort`, bounded by the install deadline ([install]
   deadline, JITSHIP_DEADLINE, default 60 s), in vLLM's own environment, so the roots are the ones
   vLLM resolves (VLLM_CACHE_ROOT, VLLM_USE_AOT_COMPILE, TMPDIR, TORCHINDUCTOR_CACHE_DIR) and the
   facts come from vLLM's own interpreter (JITSHIP_PYTHON defaults to it). --best-effort: a miss,
   an unreachable store or a configuration error never stops vLLM; jitship says why on stderr.
3. A background `jitship watch --engine vllm` that publishes what vLLM compiles as it appears
   (JITSHIP_READY_URL, when set, holds the publishes until the server answers).
4. At exit (atexit), SIGTERM to the watcher and a wait for its final publish (bounded by its grace,
   [watch] grace or JITSHIP_GRACE, default 20 s). If this process dies without running atexit,
   the kernel sends the watcher SIGTERM (PR_SET_PDEATHSIG) and it publishes once more by itself.

See docs/guide/install.md.
"""

import atexit
import os
import re
import signal
import subprocess
import sys

import jitship

_OWNER = "JITSHIP_VLLM_PLUGIN_PID"
_watcher = None


def _log(msg):
    print(f"jitship vllm plugin: {msg}", file=sys.stderr, flush=True)


def store_configured(env=None):
    """True when JITSHIP_STORE is set or JITSHIP_CONFIG names a file with a [store] table."""
    env = os.environ if env is None else env
    if env.get("JITSHIP_STORE"):
        return True
    config = env.get("JITSHIP_CONFIG")
    if not config:
        return False
    try:
        with open(config, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        # jitship itself reports the unreadable file when it runs; say so here too.
        _log(f"JITSHIP_CONFIG={config} cannot be read ({e}); doing nothing")
        return False
    return re.search(r"^\s*\[\s*store\s*[\].]", text, re.MULTILINE) is not None


def _under_jitship_run(levels=8):
    """True when an ancestor of this process is `jitship run` (which installs and publishes
    around the whole server): its /proc/PID/cmdline is a `jitship` executable and `run`."""
    pid = os.getppid()
    for _ in range(levels):
        if pid <= 1:
            return False
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat", "rb") as f:
                # The parent's pid is the 2nd field after the parenthesized command name.
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if len(argv) > 1 and os.path.basename(argv[0]) == b"jitship" and argv[1] == b"run":
            return True
    return False


def _parent_death_signal():
    """A function for the watcher's child side of fork: PR_SET_PDEATHSIG (1) = SIGTERM, so the
    kernel signals the watcher when the thread that started it ends. Resolved here, in the
    parent, so the child calls prctl and nothing else (no loading, no imports after fork).
    None where it cannot be resolved (best effort)."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    sig = int(signal.SIGTERM)
    return lambda: prctl(1, sig, 0, 0, 0)


def _stop_watcher():
    global _watcher
    w, _watcher = _watcher, None
    if w is None or w.poll() is not None:
        return
    _log("vLLM is exiting: final publish")
    w.send_signal(signal.SIGTERM)
    try:
        # The watcher's own grace bounds its final publish; this only guards against a hang.
        w.wait(timeout=float(os.environ.get("JITSHIP_VLLM_PLUGIN_STOP_TIMEOUT", "120")))
    except subprocess.TimeoutExpired:
        _log("the watcher did not stop in time; killing it")
        w.kill()
        w.wait()


def register():
    global _watcher
    if os.environ.get("JITSHIP_VLLM_PLUGIN", "1") in ("0", "false", "off", "no"):
        return
    if os.environ.get(_OWNER):
        return  # a child of the process that already installed and watches
    if not store_configured():
        return
    if _under_jitship_run():
        return  # jitship run installs, watches and publishes around this server already
    os.environ[_OWNER] = str(os.getpid())
    env = jitship.environ()
    env.setdefault("JITSHIP_PYTHON", sys.executable)
    exe = jitship.binary()
    _log("a store is configured: jitship install --engine vllm, then jitship watch --engine vllm")
    code = subprocess.call([exe, "install", "--engine", "vllm", "--best-effort"], env=env)
    if code != 0:
        _log(f"jitship install exited {code}")
    try:
        _watcher = subprocess.Popen(
            [exe, "watch", "--engine", "vllm"],
            env=env,
            stdin=subprocess.DEVNULL,
            # Its own session: a Ctrl-C meant for vLLM does not cut the watcher's final publish
            # short; atexit (or the parent-death signal) stops it.
            start_new_session=True,
            preexec_fn=_parent_death_signal(),
        )
    except OSError as e:
        _log(f"cannot start jitship watch: {e}")
        return
    atexit.register(_stop_watcher)

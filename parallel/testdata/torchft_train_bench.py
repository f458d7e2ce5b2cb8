"""PyTorch's side of the fault-tolerance benchmark: torchft training on the CPU
over gloo with --groups replica groups (3) of one process each, while replica 1 is killed
with SIGKILL every --kill_every seconds and restarted at once under the same
replica id. The fresh process gets its model and optimizer state from a healthy
peer through torchft's own recovery (the Manager's HTTP checkpoint transport),
never from a file.

Usage: torchft_train_bench.py [--duration=60] [--kill_every=15] [--baseline=X]
                              [--groups=3] [--model=mlp|resnet18]

The job
  * A torchft lighthouse (the torchft_lighthouse binary that sits next to
    sys.executable) on a free localhost port, started with
        --min_replicas=2 --join_timeout_ms=200 --quorum_tick_ms=20
    (--join_timeout_ms to change the first)
        --heartbeat_timeout_ms=1000
    min_replicas=2 rather than 1: one replica that reaches the quorum more than
    join_timeout ahead of the others (easy on 2 cores) can never form a quorum
    of one and train alone, which would force the others to heal at once;
    after a kill two members are always left, so 2 never stalls the job.
    join_timeout_ms=200 is how long the lighthouse waits for a member that
    still heartbeats but has not asked for a quorum; after a kill it is the
    stall before the two survivors go on (plus up to one 20 ms tick). In steady
    state every step is a "fast quorum" (all previous members asked again), so
    the join timeout does not slow failure-free steps.
    heartbeat_timeout_ms=1000 rather than the default 5000: the killed process
    counts as alive until its last heartbeat is that old, and once its
    replacement heartbeats too, the lighthouse's split-brain rule (more than
    half of the live replicas must have joined) refuses the 2-member quorum:
    2 of 4 "alive". With 5000 this stalled the job up to 5 s after a kill.
    Heartbeats go out every 100 ms, so 1000 ms is ten missed beats.
  * Each replica: torch.set_num_threads(1), its own TCPStore (torchft wants one
    per replica group), torchft.ProcessGroupGloo (1 s timeout:
    when a peer dies mid-allreduce, sometimes only one survivor gets a
    connection reset at once while the other waits on a peer that has already
    given up, until the gloo timeout, and the lighthouse cannot form the next
    quorum before it asks again; with 2 s we saw 2 s stalls after a kill; a
    step's allreduce takes ~1 ms and the timeout also bounds the gloo
    rendezvous on each reconfiguration),
    torchft.Manager (world size 1, replica_id "replica_<k>", min_replica_size 2,
    use_async_quorum=False so that start_quorum blocks, heals a fresh replica
    before its forward pass and makes it a full member of that same step;
    init_sync=False since torch.manual_seed(0) already makes every replica
    equal; timeout 10 s, quorum timeout 30 s, connect timeout 10 s),
    the gradients flattened into one buffer and averaged over the quorum by
    Manager.allreduce (ReduceOp.AVG: a sum over gloo, then a division by the
    quorum size), and torchft.Optimizer wrapping SGD(lr 0.01, momentum 0.9):
    zero_grad() runs start_quorum, step() runs should_commit and only then
    steps SGD.
    Not torchft.DistributedDataParallel: in torchft 0.2.0 its comm hook
    asserts (ddp.py, "assert fut._fut") when the gloo allreduce fails because
    a peer died, so the survivors of the first SIGKILL crash inside
    loss.backward() instead of skipping the step. Manager.allreduce(...).wait()
    used directly swallows the error, reports it to the manager and the step
    is not committed, which is the behaviour torchft intends.
  * --model=mlp: Sequential(Linear(64, 256), ReLU, Linear(256, 256), ReLU,
    Linear(256, 10)). The global batch of committed step s is 96 rows
    x = randn(96, 64) from a generator seeded 1000 + s, y = (x @ W).argmax(1)
    with W = randn(64, 10) seeded 7; --model=resnet18: torchvision's
    resnet18(num_classes=10), 24 rows x = randn(24, 3, 32, 32) the same way,
    y = (x.flatten(1) @ W).argmax(1), W = randn(3072, 10), and a gloo
    timeout of 10 s (its 45 MB all-reduce takes longer than 1 s on 2 cores); s is Manager.current_step(), the committed
    step, which a recovered replica receives from its peer. With n quorum
    members this replica takes rows [i*96//n, (i+1)*96//n), where
    i = Manager.participating_rank(): with the synchronous quorum that is the
    replica's index among the quorum's members sorted by replica id (the
    lighthouse and the manager both sort by it), and n = num_participants().
    Loss cross_entropy (mean over the slice; slices are equal for n = 2, 3, 4).

What it prints, one key=value a line
  steps_per_s           committed steps per second seen by replica 0 (never
                        killed) from 5 s after the replicas were launched to
                        the end of --duration; if replica 0 had not committed
                        by then (a slow start on a loaded host), the window
                        opens at its first commit instead (window_start_s)
  window_s, committed_steps, first_commit_s (replica 0's first commit, from
                        launch: normally inside the 5 s warm-up),
                        max_commit_gap_s (longest pause between two of replica
                        0's commits in the window), steps_by_quorum_size
  efficiency            steps_per_s / --baseline, only when --baseline is given
                        (the baseline is steps_per_s of a --kill_every=0 run).
                        On a 2-core host three single-threaded replicas
                        oversubscribe the CPU, so the 2-member quorum between a
                        kill and the replacement's first step runs faster than
                        the 3-member one and efficiency comes out near (even
                        above) 1; the cost of a kill shows in max_commit_gap_s
  kills                 SIGKILLs sent to replica 1
  restart_<k>_s         launch of the k-th replacement to its first committed
                        step (none if it never committed before being killed
                        or before the end), and restart_median_s;
  restart_<k>_ready_s   launch to the Manager being constructed (mostly the
                        Python and torch import of the fresh process)
  restart_<k>_healed_to_step  the step the replacement committed first (> 1
                        shows it took the peers' step, not a fresh start)
  params_agree          whether the replicas' parameter checksums agree at
                        every step that two or more of them committed
                        (params_steps_checked of them)
  done                  last, on success

Each replica writes one line per committed step (step, wall time, quorum size,
loss, parameter checksum) to its own file in a temporary directory; the
controller reads them at the end. Every wait has a timeout; at the end all
replicas and the lighthouse get SIGTERM (SIGKILL if they linger) and each
replica also dies with the controller (PR_SET_PDEATHSIG).
"""
import argparse
import ctypes
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

KILLED = 1
BATCH = 96
WARMUP_S = 5.0
JOIN_TIMEOUT_MS = 200
QUORUM_TICK_MS = 20
HEARTBEAT_TIMEOUT_MS = 1000
GLOO_TIMEOUT_S = 1
MIN_REPLICAS = 2


# ----------------------------------------------------------------------------
# One replica group (a single process).


def replica_main(args):
    from datetime import timedelta

    import torch
    import torch.nn.functional as F
    from torch.distributed import TCPStore

    import torchft

    torch.set_num_threads(1)
    store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=30))

    torch.manual_seed(0)
    resnet = args.model == "resnet18"
    if resnet:
        import torchvision
        model = torchvision.models.resnet18(num_classes=10)
        features, batch, timeout_s = 3 * 32 * 32, 24, 10
    else:
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.ReLU(),
            torch.nn.Linear(256, 256), torch.nn.ReLU(),
            torch.nn.Linear(256, 10))
        features, batch, timeout_s = 64, BATCH, GLOO_TIMEOUT_S
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def save():
        return {"model": model.state_dict(), "optim": sgd.state_dict()}

    def load(state):
        model.load_state_dict(state["model"])
        sgd.load_state_dict(state["optim"])

    pg = torchft.ProcessGroupGloo(timeout=timedelta(seconds=timeout_s))
    manager = torchft.Manager(
        pg=pg,
        load_state_dict=load,
        state_dict=save,
        min_replica_size=MIN_REPLICAS,
        use_async_quorum=False,
        init_sync=False,
        timeout=timedelta(seconds=10),
        quorum_timeout=timedelta(seconds=30),
        connect_timeout=timedelta(seconds=10),
        rank=0,
        world_size=1,
        store_addr="localhost",
        store_port=store.port,
        lighthouse_addr=args._lighthouse,
        replica_id=f"replica_{args._replica}",
        hostname="localhost",
    )
    params = list(model.parameters())
    opt = torchft.Optimizer(manager, sgd)
    w = torch.randn(features, 10, generator=torch.Generator().manual_seed(7))

    log = open(args._log, "a", buffering=1)
    log.write(f"ready {time.time():.6f}\n")
    while True:
        opt.zero_grad()  # start_quorum: blocks, heals this replica if behind
        step = manager.current_step()
        n = manager.num_participants()
        i = manager.participating_rank()
        shape = (batch, 3, 32, 32) if resnet else (batch, features)
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(1000 + step))
        y = (x.reshape(batch, features) @ w).argmax(1)
        lo, hi = i * batch // n, (i + 1) * batch // n
        loss = F.cross_entropy(model(x[lo:hi]), y[lo:hi])
        loss.backward()
        # One flat buffer, one allreduce (what a single DDP bucket would do).
        # Manager.allreduce averages over the quorum; if a peer dies the wait
        # reports the error to the manager and should_commit says no.
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        manager.allreduce(flat).wait()
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        opt.step()  # should_commit, then SGD.step only if the quorum agrees
        if manager.current_step() == step + 1:
            with torch.no_grad():
                check = sum(float(p.double().sum()) for p in model.parameters())
            log.write(f"commit {step + 1} {time.time():.6f} {n} {loss.item():.6f} {check!r}\n")


# ----------------------------------------------------------------------------
# The controller.


def free_port():
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
        s.bind(("::", 0))
        return s.getsockname()[1]


def die_with_parent():
    # Linux: the child gets SIGKILL if the controller goes away first.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def wait_port(port, proc, deadline_s):
    end = time.time() + deadline_s
    while time.time() < end:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("localhost", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def stop(proc, grace_s=5.0):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=grace_s)


def read_log(path):
    ready, commits = None, []
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if not line.endswith("\n"):
                    break  # a line cut short by SIGKILL
                if parts[0] == "ready":
                    ready = float(parts[1])
                elif parts[0] == "commit":
                    commits.append((int(parts[1]), float(parts[2]), int(parts[3]),
                                    float(parts[4]), parts[5]))
    except FileNotFoundError:
        pass
    return ready, commits


def tail(path, lines=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except FileNotFoundError:
        return "(no output)\n"


def controller(args):
    here = os.path.dirname(os.path.abspath(sys.executable))
    lighthouse_bin = os.path.join(here, "torchft_lighthouse")
    if not os.access(lighthouse_bin, os.X_OK):
        print(f"error=no torchft_lighthouse next to {sys.executable}", flush=True)
        return 1

    work = tempfile.mkdtemp(prefix="torchft_bench_")
    port = free_port()
    lh_out = open(os.path.join(work, "lighthouse.out"), "w")
    lighthouse = subprocess.Popen(
        [lighthouse_bin, f"--bind=[::]:{port}", f"--min_replicas={MIN_REPLICAS}",
         f"--join_timeout_ms={args.join_timeout_ms}", f"--quorum_tick_ms={QUORUM_TICK_MS}",
         f"--heartbeat_timeout_ms={HEARTBEAT_TIMEOUT_MS}"],
        stdout=lh_out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
    procs = {}      # replica -> Popen of its current process
    out_of = {}     # replica -> path of its current process's stdout/stderr
    outs = []       # open stdout/stderr files
    launches = []   # (incarnation, launch time, log path) of replica 1's replacements
    failed = None

    def launch(replica, incarnation):
        tag = f"r{replica}_{incarnation}"
        out_of[replica] = os.path.join(work, tag + ".out")
        out = open(out_of[replica], "w")
        outs.append(out)
        log = os.path.join(work, tag + ".log")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        p = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), f"--_replica={replica}",
             f"--_lighthouse=http://localhost:{port}", f"--_log={log}",
             f"--model={args.model}"],
            stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=die_with_parent)
        procs[replica] = p
        return log

    kills = 0
    try:
        if not wait_port(port, lighthouse, 15.0):
            failed = "lighthouse did not come up:\n" + tail(lh_out.name)
            return 1
        logs = {r: launch(r, 0) for r in range(args.groups)}
        start = time.time()
        end = start + args.duration
        next_kill = start + args.kill_every if args.kill_every > 0 else float("inf")
        while time.time() < end:
            for r, p in procs.items():
                if p.poll() is not None:
                    failed = (f"replica {r} exited on its own (rc {p.returncode}):\n"
                              + tail(out_of[r]))
                    return 1
            now = time.time()
            if now >= next_kill:
                victim = procs[KILLED]
                victim.send_signal(signal.SIGKILL)
                victim.wait(timeout=10)
                kills += 1
                log = launch(KILLED, kills)
                launches.append((kills, time.time(), log))
                next_kill += args.kill_every
            time.sleep(min(0.05, max(0.0, min(end, next_kill) - time.time())))
        stop_time = time.time()
    finally:
        for p in procs.values():
            stop(p)
        stop(lighthouse)
        for f in outs + [lh_out]:
            f.close()
        if failed:
            print(f"error={failed}", flush=True)
            shutil.rmtree(work, ignore_errors=True)

    # ---- results
    ready0, commits0 = read_log(logs[0])
    # 5 s after launch, or replica 0's first commit if the start-up (mostly
    # importing torch three times on 2 cores) took longer than that.
    lo = start + WARMUP_S
    if commits0 and commits0[0][1] > lo:
        lo = commits0[0][1]
    in_window = [c for c in commits0 if lo <= c[1] <= stop_time]
    window = stop_time - lo
    steps_per_s = len(in_window) / window if window > 0 else 0.0
    first0 = (commits0[0][1] - start) if commits0 else None
    print(f"steps_per_s={steps_per_s:.2f}")
    print(f"window_start_s={lo - start:.2f}")
    print(f"window_s={window:.2f}")
    print(f"committed_steps={len(in_window)}")
    print(f"total_committed_steps={commits0[-1][0] if commits0 else 0}")
    print(f"first_commit_s={first0:.2f}" if first0 is not None else "first_commit_s=none")
    gaps = [b[1] - a[1] for a, b in zip(in_window, in_window[1:])]
    print(f"max_commit_gap_s={max(gaps) if gaps else 0.0:.3f}")
    sizes = {}
    for c in in_window:
        sizes[c[2]] = sizes.get(c[2], 0) + 1
    print("steps_by_quorum_size=" + ",".join(f"{n}:{sizes[n]}" for n in sorted(sizes)))
    if args.baseline:
        print(f"efficiency={steps_per_s / args.baseline:.3f}")
    print(f"kills={kills}")
    times = []
    for k, t_launch, log in launches:
        ready, commits = read_log(log)
        if commits:
            dt = commits[0][1] - t_launch
            times.append(dt)
            print(f"restart_{k}_s={dt:.3f}")
            print(f"restart_{k}_ready_s={ready - t_launch:.3f}")
            print(f"restart_{k}_healed_to_step={commits[0][0]}")
        else:
            print(f"restart_{k}_s=none")
    if launches:
        print(f"restart_median_s={statistics.median(times):.3f}" if times
              else "restart_median_s=none")

    # The replicas must hold identical parameters after every commonly committed step.
    by_step = {}
    for path in sorted(os.listdir(work)):
        if path.endswith(".log"):
            for step, _, _, _, check in read_log(os.path.join(work, path))[1]:
                by_step.setdefault(step, []).append(check)
    shared = [checks for checks in by_step.values() if len(checks) > 1]
    agree = all(len(set(checks)) == 1 for checks in shared)
    print(f"params_agree={'yes' if agree else 'no'}")
    print(f"params_steps_checked={len(shared)}")
    loss_last = commits0[-1][3] if commits0 else float("nan")
    print(f"replica0_last_loss={loss_last:.4f}")
    shutil.rmtree(work, ignore_errors=True)
    leftover = [p.pid for p in list(procs.values()) + [lighthouse] if p.poll() is None]
    if leftover:
        print(f"error=processes still running: {leftover}", flush=True)
        return 1
    print("done", flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--kill_every", type=float, default=15.0)
    ap.add_argument("--baseline", type=float, default=None)
    ap.add_argument("--groups", type=int, default=3)
    ap.add_argument("--model", choices=("mlp", "resnet18"), default="mlp")
    ap.add_argument("--join_timeout_ms", type=int, default=JOIN_TIMEOUT_MS)
    # internal: run as one replica group
    ap.add_argument("--_replica", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_lighthouse", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_log", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._replica is not None:
        replica_main(args)
        return 0
    return controller(args)


if __name__ == "__main__":
    sys.exit(main())

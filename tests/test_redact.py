"""Secrets kept out of what whyidle stores and prints (whyidle.redact), other users' command lines
reduced to their program, and the run directory's permissions."""

from __future__ import annotations

import json
import os
import shlex
import stat
import string
import sys

import pytest
from conftest import invoke, run_whyidle, write_script
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic_run import write_run

from whyidle.redact import is_secret_name, redact_argv, redact_text
from whyidle.cmdline import program_and_script
from whyidle.sampling.host import process_label

#: (command line, what it must become): secrets that must vanish.
SECRETS = [
    (["python", "t.py", "--hf-token", "abc123"], ["python", "t.py", "--hf-token", "***"]),
    (["python", "t.py", "--api_key=abc123"], ["python", "t.py", "--api_key=***"]),
    (["python", "t.py", "--apiKey", "abc123"], ["python", "t.py", "--apiKey", "***"]),
    (["python", "t.py", "--db-password", "hunter2"], ["python", "t.py", "--db-password", "***"]),
    (["python", "t.py", "--password=my secret phrase"], ["python", "t.py", "--password=***"]),
    (["python", "t.py", "--pin-password", "123456"], ["python", "t.py", "--pin-password", "***"]),
    (["env", "WANDB_API_KEY=abc123", "python", "t.py"], ["env", "WANDB_API_KEY=***", "python", "t.py"]),
    (["env", "AWS_SECRET_ACCESS_KEY=x", "python", "t.py"], ["env", "AWS_SECRET_ACCESS_KEY=***", "python", "t.py"]),
    (["env", "PASSWORD=a b", "cmd"], ["env", "PASSWORD=***", "cmd"]),
    (["python", "t.py", "+db.password=abc", "trainer.logger.api_key=abc"],
     ["python", "t.py", "+db.password=***", "trainer.logger.api_key=***"]),
    (["bash", "-c", "HF_TOKEN=hf_xxx python t.py --api-key K --lr 0.1"],
     ["bash", "-c", "HF_TOKEN=*** python t.py --api-key *** --lr 0.1"]),
    (["bash", "-lc", "cd /x && MY_SECRET='a b' python t.py --db-password \"x y\" --passwd=z"],
     ["bash", "-lc", "cd /x && MY_SECRET=*** python t.py --db-password *** --passwd=***"]),
    (["python", "-c", "from huggingface_hub import login; login(token='abcdef')"],
     ["python", "-c", "from huggingface_hub import login; login(token=***)"]),
    (["python", "t.py", "--config", '{"api_key": "zzz", "lr": 1}'],
     ["python", "t.py", "--config", '{"api_key": "***", "lr": 1}']),
    (["python", "t.py", "--url", "https://u:pw@host/x"], ["python", "t.py", "--url", "https://u:***@host/x"]),
    (["git", "clone", "https://u:p@ss@host/x"], ["git", "clone", "https://u:***@host/x"]),
    (["git", "clone", "https://x-access-token:abc@github.com/o/r"],
     ["git", "clone", "https://x-access-token:***@github.com/o/r"]),
    (["git", "clone", "https://0123456789abcdefghij@github.com/o/r"], ["git", "clone", "https://***@github.com/o/r"]),
    (["python", "t.py", "hf_abcdefghijklmnopqrstuvwxyz012345"], ["python", "t.py", "hf_***"]),
    (["python", "t.py", "--model", "sk-proj-abcdefghijklmnopqrstuvwxyz"], ["python", "t.py", "--model", "sk-***"]),
    (["x", "ghp_abcdefghijklmnopqrstuvwxyz0123456789", "github_pat_11ABCDEFG0123456789_abcdefghijklmnop"],
     ["x", "ghp_***", "github_pat_***"]),
    (["x", "--id", "AKIAIOSFODNN7EXAMPLE", "ASIAIOSFODNN7EXAMPLE"], ["x", "--id", "AKIA***", "ASIA***"]),
    (["x", "xoxb-1234567890-abcdefghij"], ["x", "xoxb-***"]),
    (["x", "--jwt", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"],
     ["x", "--jwt", "eyJ***"]),
    (["curl", "-H", "Authorization: Bearer abcdefghijkl", "https://h"],
     ["curl", "-H", "Authorization: Bearer ***", "https://h"]),
    (["python", "t.py", "--http-auth", "user:pw", "--session-cookie", "sid=1"],
     ["python", "t.py", "--http-auth", "***", "--session-cookie", "***"]),
    (["env", "MYSQL_PWD=abc", "x"], ["env", "MYSQL_PWD=***", "x"]),
]

#: Command lines that look a little like secrets and must stay as they are.
LOOK_ALIKES = [
    ["python", "t.py", "--tokenizer", "gpt2", "--tokenizer-path", "tokenizer.json"],
    ["python", "t.py", "--max-tokens", "512", "--num-tokens", "many", "--special-tokens", "<s>"],
    ["python", "t.py", "--keep-last", "3", "--key-frames", "all", "--token-limit", "high"],
    ["python", "t.py", "--token-file", "/run/secrets/hf", "HF_TOKEN_PATH=/x/token", "--password-file", "pw.txt"],
    ["python", "t.py", "--use-auth-token", "--model", "gpt2"],
    ["python", "t.py", "--use-auth-token", "true", "--api-key", "", "--trust-remote-code"],
    ["env", "PWD=/home/u", "OLDPWD=/tmp", "CUDA_VISIBLE_DEVICES=0", "python", "t.py"],
    ["python", "t.py", "--author", "ada", "--monkey", "patch", "keyboard=us", "--hotkey", "f5"],
    ["ssh://git@github.com/o/r", "https://huggingface.co/gpt2", "http://localhost:8080/x"],
    ["python", "-c", "from multiprocessing.resource_tracker import main;main(6)"],
    ["python", "-c", "from multiprocessing.forkserver import main; main(10, 11, ['__main__'], **{'sys_path': ['/x']})"],
    ["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
     "--multiprocessing-fork"],
    ["torchrun", "--nproc-per-node=2", "--rdzv-endpoint=host:29500", "train.py", "task-abcdefghijklmnopqrstuvwxyz"],
    ["python", "t.py", "--lr", "3e-4", "--bearer", "none"],
]


@pytest.mark.parametrize(("argv", "expected"), SECRETS, ids=[shlex.join(a)[:50] for a, _ in SECRETS])
def test_secrets_are_redacted(argv, expected):
    assert redact_argv(argv) == expected
    assert redact_argv(expected) == expected  # idempotent


@pytest.mark.parametrize("argv", LOOK_ALIKES, ids=[shlex.join(a)[:50] for a in LOOK_ALIKES])
def test_look_alikes_are_kept(argv):
    assert redact_argv(argv) == argv


def test_secret_names():
    for name in ("--hf-token", "--api_key", "--apiKey", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "+db.password",
                 "--passwd", "--auth", "--oauth", "GOOGLE_APPLICATION_CREDENTIALS", "MYSQL_PWD", "--key"):
        assert is_secret_name(name), name
    for name in ("--tokenizer", "--max-tokens", "--keep-last", "--key-frames", "--token-file", "HF_TOKEN_PATH",
                 "--author", "PWD", "OLDPWD", "--monkey", "--", "-"):
        assert not is_secret_name(name), name


def test_redact_text_of_sentences_and_non_strings():
    text = "other processes: `python job.py --api-key abc` (pid 7, 1.2 cores), `HF_TOKEN=xyz python x.py`"
    assert redact_text(text) == ("other processes: `python job.py --api-key ***` (pid 7, 1.2 cores), "
                                 "`HF_TOKEN=*** python x.py`")
    assert redact_text("") == "" and redact_text(None) is None
    assert redact_argv(["python", 3, None]) == ["python", 3, None]


# -- properties ---------------------------------------------------------------------------------

#: Values a secret may take: no whitespace, not starting like an option, not a boolean word.
SECRET_VALUES = st.text(alphabet=string.ascii_letters + string.digits + "!#$%&()*+,./:;<=>?@[]^_`{|}~-",
                        min_size=8, max_size=40).filter(lambda v: not v.startswith("-"))


@settings(max_examples=300, deadline=None)
@given(SECRET_VALUES, st.sampled_from(["--api-key", "--hf_token", "--dbPassword", "-secret", "--aws.secret-key"]))
def test_any_value_of_a_secret_name_vanishes(value, option):
    env_name = option.lstrip("-").replace("-", "_").replace(".", "_").upper()
    assert redact_argv(["python", "t.py", option, value]) == ["python", "t.py", option, "***"]
    assert redact_argv(["python", "t.py", f"{option}={value}"]) == ["python", "t.py", f"{option}=***"]
    assert redact_argv(["env", f"{env_name}={value}", "python"]) == ["env", f"{env_name}=***", "python"]
    shell = f"{env_name}={shlex.quote(value)} python t.py {option} {shlex.quote(value)}"
    out = redact_argv(["bash", "-c", shell])
    assert out == ["bash", "-c", f"{env_name}=*** python t.py {option} ***"], out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet=string.printable, max_size=60), max_size=12))
def test_redaction_is_idempotent(argv):
    once = redact_argv(argv)
    assert len(once) == len(argv)
    assert redact_argv(once) == once
    text = " ".join(argv)
    assert redact_text(redact_text(text)) == redact_text(text)


SAFE_NAMES = st.lists(st.sampled_from(["lr", "batch", "size", "epochs", "tokenizer", "keep", "last", "max", "tokens",
                                       "data", "dir", "model", "key", "frames", "num", "workers", "seed", "file"]),
                      min_size=1, max_size=3).map("-".join).filter(lambda n: not is_secret_name(n))
SAFE_VALUES = st.text(alphabet=string.ascii_lowercase + string.digits + "./", max_size=16)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(SAFE_NAMES, SAFE_VALUES, st.sampled_from(["space", "equals", "env", "positional"])),
                max_size=8))
def test_non_secret_command_lines_are_unchanged(args):
    argv = ["python", "train.py"]
    for name, value, form in args:
        argv += {"space": [f"--{name}", value], "equals": [f"--{name}={value}"],
                 "env": [f"{name.upper().replace('-', '_')}={value}"], "positional": [value]}[form]
    assert redact_argv(argv) == argv


# -- other processes ----------------------------------------------------------------------------

def test_another_users_process_is_named_by_its_program_only():
    cmdline = ["/usr/bin/python3", "/home/bob/job.py", "--api-key", "abc123", "--data", "/home/bob/private"]
    assert process_label(cmdline, "python3", uid=1001, own_uid=1000) == "python3"
    assert process_label(cmdline, None, uid=1001, own_uid=1000) == "python3"
    assert process_label([], None, uid=None, own_uid=1000) == "?"
    assert process_label(cmdline, "python3", uid=None, own_uid=None) == "python3"  # unknown owner
    assert process_label(cmdline, "python3", uid=1000, own_uid=1000) == "python3 job.py"


#: (command line of a process outside the job, its name in the report): program and script only.
OUTSIDE = [
    (["/usr/bin/python3", "/home/u/jobs/burn.py", "2", "60"], "python3 burn.py"),
    (["python", "-u", "-W", "ignore", "train.py", "--lr", "3"], "python train.py"),
    (["python", "-W", "secretish", "t.py"], "python t.py"),
    (["python3", "-c", "import time; time.sleep(30)", "SECRET123"], "python3 -c"),
    (["python3", "-Bc", "pass", "SECRET123"], "python3 -c"),
    (["python", "-", "SECRET123"], "python -"),
    (["python", "-m", "pkg.serve", "--token", "SECRET123"], "python -m pkg.serve"),
    (["python", "-m"], "python -m"),
    (["sshpass", "-p", "SECRET123", "ssh", "user@host"], "sshpass"),
    (["/usr/bin/mysql", "-uroot", "-pSECRET123", "db"], "mysql"),
    (["bash", "-c", "PASS=SECRET123 ./run.sh"], "bash -c"),
    (["bash", "/opt/jobs/nightly.sh", "SECRET123"], "bash nightly.sh"),
    (["torchrun", "--nproc-per-node", "2", "train.py", "--hf-token", "SECRET123"], "torchrun train.py"),
    (["node", "server.js", "SECRET123"], "node server.js"),
    (["postgres: user db 127.0.0.1(5432) SECRET123"], "postgres"),
    (["tool", "SECRET123.txt", "KEY=a.py", "x y.py"], "tool"),
    ([], "?"),
]


@pytest.mark.parametrize("argv,name", OUTSIDE)
def test_a_process_outside_the_job_keeps_its_program_and_script_only(argv, name):
    assert program_and_script(argv) == name
    assert "SECRET123" not in program_and_script(argv, "comm")


def test_other_processes_recorded_in_full_by_older_versions_are_cut_when_read():
    from whyidle.record.reader import redact_run

    host = [{"k": "host_top", "procs": [[1, "python3 burn.py 2 60", 1.0], [2, "kworker/0:1", 0.5],
                                        [3, "sshpass -p SECRET123 ssh user@host", 0.4]],
             "yielding_procs": [[4, "mysql -uroot -pSECRET123", 0.1]]}]
    redact_run({}, host, {})
    assert [row[1] for row in host[0]["procs"] + host[0]["yielding_procs"]] == \
        ["python3 burn.py", "kworker/0:1", "sshpass", "mysql"]


def test_a_process_without_a_command_line_is_named_by_its_program():
    assert program_and_script([], "kworker/0:1") == "kworker/0:1"
    assert process_label([], "kworker/0:1", uid=0, own_uid=1000) == "kworker/0:1"


# -- reports from runs recorded before redaction --------------------------------------------------

def test_reports_of_old_unredacted_runs_hide_the_secrets(tmp_path):
    secrets = ["oldSecretValue1", "oldSecretValue2", "oldSecretValue3"]
    command = ["python", "train.py", "--hf-token", secrets[0], f"--password={secrets[1]}"]
    runs = []
    for name in ("a", "b"):
        run = write_run(tmp_path / name, steps=40, command=command)
        with open(os.path.join(run, "host.jsonl"), "a") as f:  # another process, recorded in full
            f.write(json.dumps({"k": "host_top", "t": 1_005_000_000_000, "t0": 1_000_000_000_000,
                                "t1": 1_005_000_000_000, "total_cpu_s": 4.0,
                                "procs": [[99, f"python burn.py --api-key {secrets[2]}", 4.0]]}) + "\n")
        runs.append(run)
    html = tmp_path / "page.html"
    shown = invoke(["report", runs[0], "--json", tmp_path / "r.json", "--html", html])
    assert shown.returncode == 0, shown.stderr
    compared = invoke(["compare", runs[0], runs[1], "--json", tmp_path / "c.json"])
    compared_text = invoke(["compare", runs[0], runs[1]])
    outputs = [p.stdout + p.stderr for p in (shown, compared, compared_text)]
    for path in ("r.json", "page.html", "c.json", "a/report.json", "a/timeline.json"):
        with open(tmp_path / path, encoding="utf-8") as f:
            outputs.append(f.read())
    report = json.loads(outputs[3])
    assert report["command"] == ["python", "train.py", "--hf-token", "***", "--password=***"]
    for text in outputs:
        for secret in secrets:
            assert secret not in text


# -- end to end ---------------------------------------------------------------------------------

def _files(run_dir):
    for root, dirs, files in os.walk(run_dir):
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                yield path


@pytest.mark.slow
def test_run_keeps_secrets_out_of_the_run_directory_and_the_terminal(tmp_path):
    """``whyidle run`` of a command holding secrets: the program sees them unchanged; no file of
    the run directory and nothing whyidle prints holds them; the directory is 0700, its files 0600."""
    secrets = ["e2eWandbKey7Qx", "e2eHfTokenB9z", "e2ePassW0rdC4", "e2eUrlPassD2k"]
    seen = tmp_path / "seen.json"  # what the program got, outside the run directory
    script = write_script(tmp_path / "tiny.py", steps=15,
                          pre="import json\njson.dump({'argv': sys.argv[1:], 'key': os.environ.get('WANDB_API_KEY')}, "
                              f"open({str(seen)!r}, 'w'))")
    run_dir = str(tmp_path / "run")
    args = ["--hf-token", secrets[1], f"--password={secrets[2]}", "--url", f"https://u:{secrets[3]}@h/x"]
    proc = run_whyidle(["run", "--out", run_dir, "--", "env", f"WANDB_API_KEY={secrets[0]}", sys.executable, script,
                        *args], timeout=120)
    assert proc.returncode == 0, proc.stderr
    with open(seen) as f:
        assert json.load(f) == {"argv": args, "key": secrets[0]}  # the command ran unchanged
    terminal = (proc.stdout + proc.stderr).replace("trained 15", "")
    assert "***" in terminal  # the report's command line, redacted
    files = list(_files(run_dir))
    names = {os.path.relpath(p, run_dir) for p in files}
    assert {"meta.json", "report.json", "report.html", "timeline.json", "host.jsonl"} <= names
    assert any(n.startswith("proc-") for n in names)
    for path in files:
        with open(path, "rb") as f:
            data = f.read()
        for secret in secrets:
            assert secret.encode() not in data, (path, secret)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    for secret in secrets:
        assert secret not in terminal
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(run_dir, ".bootstrap")).st_mode) == 0o700
    with open(os.path.join(run_dir, "meta.json")) as f:
        assert json.load(f)["command"][1] == "WANDB_API_KEY=***"


#: A loop that burns CPU for a while, for the processes outside the job.
_BUSY = "import time\nt = time.time()\nwhile time.time() - t < 40:\n    pass\n"


@pytest.mark.slow
def test_bare_secrets_of_other_processes_reach_no_file_and_no_terminal(tmp_path):
    """Processes outside the job holding a secret as a bare argument (no redaction rule matches
    it) while ``whyidle run`` observes a short job: the secret is in no file of the run directory
    and nowhere in what whyidle prints; the processes are still named by their program."""
    import subprocess

    secrets = ["bareSecretPyC81", "bareSecretSsh62", "bareSecretSql47", "bareSecretStdin5"]
    busy = tmp_path / "busy.py"
    busy.write_text(_BUSY)
    awk = "BEGIN { t = systime(); while (systime() - t < 40) ; }"
    commands = [
        [sys.executable, "-c", _BUSY, secrets[0]],
        ["bash", "-c", f"exec -a sshpass awk {shlex.quote(awk)} -p {secrets[1]} ssh user@host"],
        ["bash", "-c", f"exec -a mysql awk {shlex.quote(awk)} -uroot -p{secrets[2]} db"],
        ["bash", "-c", f"exec {shlex.quote(sys.executable)} - {secrets[3]} < {shlex.quote(str(busy))}"],
    ]
    # niced: they take only the cores the job leaves, and are recorded as yielding processes
    others = [subprocess.Popen(c, preexec_fn=lambda: os.nice(19)) for c in commands]
    try:
        for p, secret in zip(others, secrets):  # each is running with its secret on its command line
            with open(f"/proc/{p.pid}/cmdline", "rb") as f:
                assert secret.encode() in f.read()
        script = write_script(tmp_path / "short.py", steps=60, in_step="time.sleep(0.1)")
        run_dir = str(tmp_path / "run")
        proc = run_whyidle(["run", "--out", run_dir, "--", sys.executable, script], timeout=180)
    finally:
        for p in others:
            p.kill()
            p.wait()
    assert proc.returncode == 0, proc.stderr
    terminal = proc.stdout + proc.stderr
    files = list(_files(run_dir))
    names = {os.path.relpath(p, run_dir) for p in files}
    assert {"report.json", "report.html", "host.jsonl", "meta.json"} <= names
    held = {}
    for path in files:
        with open(path, "rb") as f:
            held[path] = f.read()
        for secret in secrets:
            assert secret.encode() not in held[path], (path, secret)
    for secret in secrets:
        assert secret not in terminal
    host = held[os.path.join(run_dir, "host.jsonl")].decode()
    # the processes were seen and named (so the test looked where the secrets would have been)
    assert '"sshpass"' in host and '"mysql"' in host, "the other processes were not recorded"

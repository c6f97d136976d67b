"""Checks that every health check's command exists in the image it runs in.

Usage: check-health-commands.py DOCKER SHIPPED_COMPOSE RUN_COMPOSE

SHIPPED_COMPOSE is deploy/compose.yaml; RUN_COMPOSE is the file the test
runs (the shipped one with deploy/compose.test.yaml applied: stand-in images).
For every service with a health check in either, the command of each check
must be in the image the test runs it on: for `CMD`, the program on the
container's PATH, as Docker looks it up; for `CMD-SHELL`, /bin/sh and the
shell command's first word (a builtin of sh, or a program on PATH). Nothing
is started: each path is copied out of a created container (`docker cp -L`,
which follows links inside the image) and must be a file with an execute bit.
Prints one line per check; exits 1 naming every command that is missing.
"""

import io
import re
import shlex
import subprocess
import sys
import tarfile

import yaml

# Docker's PATH for a container whose image and service set none.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Builtins of every POSIX sh (dash, busybox ash, bash) a check may start with.
SH_BUILTINS = {":", ".", "[", "cd", "command", "echo", "exit", "false", "kill",
               "printf", "read", "set", "test", "true", "type", "wait"}
# `NAME=value` before a shell command's first word.
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def docker(*args, binary=False):
    out = subprocess.run([DOCKER, *args], capture_output=True, check=False)
    return out.returncode, (out.stdout if binary else out.stdout.decode().strip())


def environment_path(service, image_env):
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env if "=" in e)
    if env.get("PATH"):
        return env["PATH"]
    for entry in image_env or []:
        if entry.startswith("PATH="):
            return entry[5:]
    return DEFAULT_PATH


class Image:
    """A created (never started) container of one image, to look paths up in."""

    def __init__(self, name):
        self.name = name
        code, env = docker("image", "inspect", "-f", "{{json .Config.Env}}", name)
        if code != 0:
            raise SystemExit(f"test-compose: image {name} is not there to check")
        self.env = yaml.safe_load(env)
        code, self.container = docker("create", name)
        if code != 0:
            raise SystemExit(f"test-compose: cannot create a container of {name}")

    def executable(self, path):
        code, data = docker("cp", "-L", f"{self.container}:{path}", "-", binary=True)
        if code != 0:
            return False
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            member = tar.next()
        return member is not None and member.isfile() and member.mode & 0o111 != 0

    def which(self, program, path):
        if "/" in program:
            return program if self.executable(program) else None
        for directory in path.split(":"):
            if directory and self.executable(f"{directory.rstrip('/')}/{program}"):
                return f"{directory.rstrip('/')}/{program}"
        return None

    def remove(self):
        docker("rm", "-f", self.container)


def needs(test):
    """The programs a health check runs, as (program, via-shell) pairs."""
    if isinstance(test, str):
        test = ["CMD-SHELL", test]
    if not test or test[0] == "NONE":
        return []
    if test[0] == "CMD":
        return [(test[1], False)]
    if test[0] == "CMD-SHELL":
        words = shlex.split(test[1])
        while words and ASSIGNMENT.match(words[0]):
            words.pop(0)
        return [("/bin/sh", False)] + ([(words[0], True)] if words else [])
    raise SystemExit(f"test-compose: unknown health check form {test!r}")


def main():
    global DOCKER
    DOCKER = sys.argv[1]
    shipped = yaml.safe_load(open(sys.argv[2]))["services"]
    running = yaml.safe_load(open(sys.argv[3]))["services"]
    images = {}
    try:
        missing = check(shipped, running, images)
    finally:
        for image in images.values():
            image.remove()
    for line in missing:
        print(f"test-compose: MISSING: {line}", file=sys.stderr)
    sys.exit(1 if missing else 0)


def check(shipped, running, images):
    """Looks every check's programs up; returns a line for each one missing."""
    missing = []
    for name, service in running.items():
        checks = []
        for source, svc in (("compose.yaml", shipped.get(name, {})), ("the test's", service)):
            health = svc.get("healthcheck") or {}
            test = health.get("test")
            if test and not health.get("disable") and test not in [t for _, t in checks]:
                checks.append((source, test))
        if not checks:
            continue
        image = images.get(service["image"]) or images.setdefault(service["image"], Image(service["image"]))
        path = environment_path(service, image.env)
        found = []
        for source, test in checks:
            for program, via_shell in needs(test):
                if via_shell and program in SH_BUILTINS:
                    found.append(f"{program} (sh builtin)")
                elif where := image.which(program, path):
                    found.append(where)
                else:
                    shipped_image = shipped.get(name, {}).get("image", service["image"])
                    missing.append(
                        f"{name}: {source} health check runs `{program}`, which {service['image']} "
                        f"(standing in for {shipped_image}) does not have on PATH {path}")
        print(f"test-compose: {name}'s health checks find {', '.join(dict.fromkeys(found))} "
              f"in {service['image']}", file=sys.stderr)
    return missing


DOCKER = "docker"
if __name__ == "__main__":
    main()

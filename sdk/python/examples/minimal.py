"""The smallest useful Warren program: one sandbox, a file in, a command, a
file out. Run against `warren up` (WARREN_URL / WARREN_TOKEN or the token
file under /var/lib/warren)."""

from __future__ import annotations

import warren


def main() -> None:
    with warren.Client() as client:
        with client.sandbox(image="busybox:latest", cpu=0.5, memory="256M", ttl="10m") as sb:
            sb.files.write("/work/hello.sh", "echo hello from $(hostname)\n")
            result = sb.exec(["sh", "/work/hello.sh"])
            print(result.exit_code, result.stdout_text, end="")
            for event in sb.exec_stream("for i in 1 2 3; do echo $i; sleep 0.1; done"):
                if isinstance(event, warren.ExecOutput):
                    print("streamed:", event.text, end="")


if __name__ == "__main__":
    main()

"""What the host-side summaries of the guest scripts share (compare-rxe.sh, ab-attach.sh,
timeline-rxe.sh); their embedded python finds it through scripts/lib/script.sh's lib_python."""
import os
import platform


def host_info():
    """The host's CPU model, CPU count and kernel release, for the JSON summaries."""
    cpu_model = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu_model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    return {"cpu": cpu_model, "cpus": os.cpu_count(), "kernel": platform.release()}

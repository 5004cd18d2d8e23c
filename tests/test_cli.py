"""The command line answers every subcommand's --help, and info reports the cache."""
def test_cli_commands_answer_help_and_info():
    import subprocess
    import sys
    for cmd in (["--help"], ["check", "--help"], ["bench", "--help"], ["info", "--help"], ["info"]):
        r = subprocess.run([sys.executable, "-m", "cuprope", *cmd], capture_output=True, text=True)
        assert r.returncode == 0, (cmd, r.stderr)
        assert r.stdout.strip()
    r = subprocess.run([sys.executable, "-m", "cuprope", "info"], capture_output=True, text=True)
    assert "kernel compile cache" in r.stdout and "to clear it" in r.stdout

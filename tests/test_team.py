"""`lmpipe team up` refuses what it cannot do in one line, before it makes anything (the servers themselves:
tests/test_e2e_scale_out.py, with PostgreSQL)."""

from __future__ import annotations

import pytest

from lmpipe_cli import team
from lmpipe.errors import LmpipeError
from tests.helpers import taken_port


def test_a_port_in_use_is_one_line_naming_the_flag_and_nothing_is_made(tmp_path):
    with taken_port() as port:
        with pytest.raises(LmpipeError, match=rf"^127\.0\.0\.1:{port} is taken by another program \(choose another: "
                                              r"lmpipe team up --mlflow-port N\)$"):
            team.up(tmp_path / "team", {**{name: 0 for name in team.PORTS}, "mlflow": port})  # the others free (0),
            # whatever runs on their default ports (a team already up on this machine)
    assert not (tmp_path / "team").exists()


def test_without_postgresql_up_says_how_to_install_it_and_makes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(team.shutil, "which", lambda tool: None)
    monkeypatch.setattr(team.glob, "glob", lambda pattern: [])
    ports = {name: 0 for name in team.PORTS}  # port 0 is always free to bind
    with pytest.raises(LmpipeError, match=r"^no PostgreSQL server program `initdb` found: install PostgreSQL"):
        team.up(tmp_path / "team", ports)
    assert not (tmp_path / "team").exists()


def test_down_without_a_team_stops_nothing(tmp_path):
    assert team.down(tmp_path / "none") == []


def test_with_a_team_server_set_lmpipe_server_starts_no_local_one(tmp_path, monkeypatch, capsys):
    """`make study` runs `lmpipe server`: with PREFECT_API_URL set (a team's), the stages report there, and a local
    server would be one more process for nothing."""
    from lmpipe_cli import main as cli, server

    started = []
    monkeypatch.setattr(server, "start", lambda *a, **k: started.append(a))
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4300/api")
    assert cli.main(["server"]) == 0
    assert started == [] and "PREFECT_API_URL=http://127.0.0.1:4300/api is set" in capsys.readouterr().out

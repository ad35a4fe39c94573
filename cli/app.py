"""The `rlhf` Typer app: one thin command per pipeline stage, plus params, doctor (and query, audit).

    rlhf --help
"""

from __future__ import annotations

from pathlib import Path

import typer

from rlhf.cli import doctor as doctor_cmd
from rlhf.cli import query as query_cmd
from rlhf.cli.world import world_app
from rlhf.cli import ppo as ppo_cmd
from rlhf.cli import eval as eval_cmd
from rlhf.cli import export as export_cmd
from rlhf.cli import funnel as funnel_cmd
from rlhf.cli import route as route_cmd
from rlhf.cli import sft as sft_cmd
from rlhf.cli import preferences as preferences_cmd
from rlhf.cli import reward as reward_cmd
from rlhf.cli import difficulty as difficulty_cmd
from rlhf.cli import demos as demos_cmd
from rlhf.cli import judge as judge_cmd
from rlhf.cli.common import fail

app = typer.Typer(
    name="rlhf",
    help="Declarative, reproducible RLHF: every stage of the pipeline, one command each.\n\n"
    "`dvc repro` runs them all; each command here runs one stage with explicit paths.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    add_completion=False,
)

params_app = typer.Typer(help="Inspect and validate params.yaml.", no_args_is_help=True)
app.add_typer(params_app, name="params")


@app.callback()
def _setup() -> None:
    """Every command: progress bars on, library bars and unactionable warnings off."""
    from rlhf.cli.common import forget_params_read
    from rlhf.pipeline import progress
    from rlhf.pipeline.models import text

    forget_params_read()
    text.use_prompt_format("auto")  # a command that renders prompts reads its own (text:)
    progress.quiet_libraries()
    progress.enable()
app.add_typer(world_app, name="world")


@params_app.command("check")
def params_check(
    params: Path = typer.Option(Path("params.yaml"), "--params", "-p", help="Params file."),
) -> None:
    """Validate every section of params.yaml against its typed config."""
    from rlhf.pipeline.config import ConfigError, load_all

    try:
        sections = load_all(params)
    except ConfigError as exc:
        fail(str(exc))
    typer.echo(f"{params}: {len(sections)} section(s) valid: {', '.join(sections) or '(none)'}")


app.command("doctor")(doctor_cmd.doctor)
app.command("query")(query_cmd.query)
app.command("tables")(query_cmd.tables)
app.command("audit")(query_cmd.audit)
app.command("rollup")(query_cmd.rollup)

app.command("ppo")(ppo_cmd.ppo)
app.command("eval")(eval_cmd.eval_cmd)
app.command("ingest")(funnel_cmd.ingest)
app.command("dedup")(funnel_cmd.dedup)
app.command("sft")(sft_cmd.sft)
app.command("preferences")(preferences_cmd.preferences)
app.command("reward")(reward_cmd.reward)
app.command("reward-figures")(reward_cmd.reward_figures)
app.command("difficulty")(difficulty_cmd.difficulty)
app.command("route")(route_cmd.route)
app.command("demos")(demos_cmd.demos)
app.command("judge")(judge_cmd.judge)
app.command("export")(export_cmd.export)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

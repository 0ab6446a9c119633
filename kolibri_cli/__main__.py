from kolibri_cli.cli import app

app(prog_name="kolibri")

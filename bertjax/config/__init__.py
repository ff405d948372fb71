"""Settings: every trainer setting declared once (`settings`), the table of allowed values derived
from those declarations (`config_rules`), the checks run before a run prepares or writes anything
(`config_checks`), and the loader of config files and command-line overrides (`config_lib`)."""

"""``python -m ci``: run every repository check and list all violations."""

import sys

from ci import check_docstrings, check_import_rules, check_module_size, check_plugin_contract

CHECKS = {"module size": check_module_size, "import rules": check_import_rules, "plugin contract": check_plugin_contract,
          "docstrings": check_docstrings}

failed = False
for title, check in CHECKS.items():
    found = check.violations()
    print(f"{title}: {'ok' if not found else f'{len(found)} violation(s)'}")
    for violation in found:
        print(f"  {violation}")
    failed = failed or bool(found)
sys.exit(1 if failed else 0)

"""Extract the validation schemas of CustomResourceDefinitions into deploy/schemas/ (see deploy/schemas/README.md).

    python deploy/tools/vendor_crd_schemas.py CRD.yaml [CRD.yaml ...]

For each served version of each CRD it writes spec.versions[].schema.openAPIV3Schema, unchanged, to
deploy/schemas/<group>/<kind lower-case>_<version>.json (the layout kubeconform and the CRDs catalog use), compact
and with sorted keys so a re-vendoring diffs cleanly. Needs PyYAML (the tools venv has it).
"""
import json
import os
import sys

import yaml

SCHEMAS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "schemas")


def vendor(path, out_dir=SCHEMAS):
    written = []
    with open(path, encoding="utf-8") as handle:
        for crd in yaml.safe_load_all(handle):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                if not version.get("served", True):
                    continue
                schema = version["schema"]["openAPIV3Schema"]
                target = os.path.join(out_dir, group, f"{kind.lower()}_{version['name']}.json")
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "w", encoding="utf-8") as out:
                    json.dump(schema, out, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                    out.write("\n")
                written.append(target)
    return written


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for crd_path in sys.argv[1:]:
        for target in vendor(crd_path):
            print(target)

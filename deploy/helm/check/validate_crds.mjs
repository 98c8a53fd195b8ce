// Validates custom resources against their CRDs' OpenAPI schemas, as @kubernetes-models
// compiles them. Reads a JSON array of objects on stdin; writes a JSON array of verdicts (null:
// valid, else the reason), one per object. The modules are imported by path from the
// node_modules directory given as the only argument, so this file needs no package of its own.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const nodeModules = process.argv[2];
const models = {
  "monitoring.coreos.com/v1 ServiceMonitor":
    ["@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor.js", "ServiceMonitor"],
  "keda.sh/v1alpha1 ScaledObject":
    ["@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject.js", "ScaledObject"],
};

async function modelFor(object) {
  const entry = models[`${object.apiVersion} ${object.kind}`];
  if (!entry) return null;
  const module = await import(pathToFileURL(join(nodeModules, entry[0])).href);
  return module[entry[1]];
}

const objects = JSON.parse(readFileSync(0, "utf8"));
const verdicts = [];
for (const object of objects) {
  const Model = await modelFor(object);
  if (!Model) {
    verdicts.push(`no CRD schema for ${object.apiVersion} ${object.kind}`);
    continue;
  }
  try {
    new Model(object).validate();
    verdicts.push(null);
  } catch (error) {
    verdicts.push(String(error.message));
  }
}
process.stdout.write(JSON.stringify(verdicts));

// FLUX.1's registry entry (model "flux"): flavors debugmodel, flux-debug, flux-schnell, flux-dev;
// trained by rectified flow (ModelSpec::objective "flow_matching") on image-caption data.
#pragma once

#include "titan/models/registry.h"

namespace titan {

ModelSpec make_flux_spec();

}  // namespace titan

// Precompiled header for every titan.cpp target: the heavy libtorch headers that almost every
// translation unit needs. Keep <torch/torch.h> out of here; it doubles compile times.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

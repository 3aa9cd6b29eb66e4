// Public C++ API of cnccl: build a c10d::ProcessGroup and attach cnccl for a device type with
// pg->setBackend(device, c10d::ProcessGroup::BackendType::CUSTOM, backend).
#pragma once

#include "backend/options.h"
#include "backend/process_group.h"

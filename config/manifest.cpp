#include "config/manifest.hpp"

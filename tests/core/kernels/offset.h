#pragma once
inline constexpr int kOffset = 0;

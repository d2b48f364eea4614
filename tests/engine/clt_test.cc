// OpenTable (the CLT, the link table, the ring index) and the pass table:
// checked against std::map / a plain list as the model.
#include "engine/clt.h"

#include <catch2/catch.hpp>
#include <map>
#include <random>

#include "engine/pass_table.h"

using namespace netreduce::engine::detail;

TEST_CASE("OpenTable matches a std::map under random insert and erase, clusters included",
          "[clt]") {
  Clt clt(64);  // 128 slots
  REQUIRE(clt.capacity() == 64);
  std::map<std::tuple<uint32_t, uint32_t, uint32_t>, uint32_t> model;
  std::mt19937 rng(3);
  auto r32 = [&] { return static_cast<uint32_t>(rng()); };
  for (int step = 0; step < 20000; ++step) {
    // A few src/dst values and QPNs: many keys collide on their home slot.
    const ConnKey k{0x0A000000u + r32() % 4, 0x0A000000u + r32() % 4, r32() % 24};
    const auto mk = std::make_tuple(k.src, k.dst, k.qpn);
    if (r32() % 3 == 0) {
      clt.erase(k);
      model.erase(mk);
    } else if (Clt::Slot* s = clt.insert(k)) {
      if (!model.count(mk)) CHECK(s->owner == 0);  // a new entry starts empty
      s->owner = static_cast<uint32_t>(step);
      model[mk] = s->owner;
    } else {
      CHECK(model.size() == clt.capacity());  // refused only when full
      CHECK(!model.count(mk));
    }
    REQUIRE(clt.size() == model.size());
    if (step % 97 == 0)
      for (const auto& [key, owner] : model) {
        const Clt::Slot* s = clt.find({std::get<0>(key), std::get<1>(key), std::get<2>(key)});
        REQUIRE(s);
        CHECK(s->owner == owner);
      }
  }
}

TEST_CASE("OpenTable refuses the entry past its capacity and takes it after an erase", "[clt]") {
  OpenTable<uint64_t, ConnValue> t(16);
  for (uint64_t k = 0; k < t.capacity(); ++k) REQUIRE(t.insert(k * 977));
  CHECK(t.insert(5) == nullptr);
  CHECK(t.insert(977) != nullptr);  // an existing key is still found
  t.erase(3 * 977);
  CHECK(t.find(3 * 977) == nullptr);
  CHECK(t.insert(5) != nullptr);
  CHECK(t.home(5) != nullptr);
}

TEST_CASE("PassTable remembers PSN ranges per connection and evicts the least recently used",
          "[clt][pass]") {
  PassTable pass(PassTable::kWays);  // one set of 8 ways
  const ConnKey a{1, 2, 3};
  pass.add(a, 0xFFFFFE, 4);  // wraps: 0xFFFFFE..0x000001
  CHECK(pass.contains(a, 0xFFFFFF));
  CHECK(pass.contains(a, 0x000001));
  CHECK(!pass.contains(a, 0x000002));
  CHECK(!pass.contains({1, 2, 4}, 0xFFFFFF));
  for (uint32_t q = 10; q < 10 + PassTable::kWays - 1; ++q) pass.add({1, 2, q}, 100, 1);
  CHECK(pass.evictions() == 0);
  CHECK(pass.contains(a, 0xFFFFFE));  // refreshes a: now the most recent
  pass.add({1, 2, 99}, 100, 1);       // evicts the oldest, connection 10
  CHECK(pass.evictions() == 1);
  CHECK(pass.contains(a, 0xFFFFFE));
  CHECK(!pass.contains({1, 2, 10}, 100));
}

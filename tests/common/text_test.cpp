#include "joule/common/text.hpp"

#include <gtest/gtest.h>

namespace {

TEST(TextTest, valid_utf8_is_recognised) {
  EXPECT_TRUE(joule::is_valid_utf8(""));
  EXPECT_TRUE(joule::is_valid_utf8("plain ascii"));
  EXPECT_TRUE(joule::is_valid_utf8("Jülich – 東京 – 🙂"));
}

TEST(TextTest, ill_formed_utf8_is_refused) {
  EXPECT_FALSE(joule::is_valid_utf8("\xff"));
  EXPECT_FALSE(joule::is_valid_utf8("abc\x80"));           // a lone continuation byte
  EXPECT_FALSE(joule::is_valid_utf8("\xc3"));              // a truncated sequence
  EXPECT_FALSE(joule::is_valid_utf8("\xc0\xaf"));          // an overlong '/'
  EXPECT_FALSE(joule::is_valid_utf8("\xed\xa0\x80"));      // a UTF-16 surrogate
  EXPECT_FALSE(joule::is_valid_utf8("\xf4\x90\x80\x80"));  // above U+10FFFF
}

TEST(TextTest, printable_escapes_controls_and_stray_bytes_and_keeps_letters) {
  EXPECT_EQ(joule::printable("job\n2026-01-01 [info] forged"), "job\\n2026-01-01 [info] forged");
  EXPECT_EQ(joule::printable("a\tb\x1b[31m"), "a\\tb\\x1b[31m");
  EXPECT_EQ(joule::printable("/\xff/x"), "/\\xff/x");
  EXPECT_EQ(joule::printable("back\\slash"), "back\\\\slash");
  EXPECT_EQ(joule::printable("Jülich"), "Jülich");
  EXPECT_TRUE(joule::is_valid_utf8(joule::printable("\xc3\x28\xa0\xa1")));
}

TEST(TextTest, printable_cuts_long_text) {
  const std::string cut = joule::printable(std::string(5000, 'a'), 100);
  EXPECT_EQ(cut, std::string(100, 'a') + "...");
}

TEST(TextTest, c1_controls_line_separators_and_bidi_overrides_count_as_controls_and_are_escaped) {
  EXPECT_TRUE(joule::has_control_character("x\u00852026-01-01 critical: forged"));  // NEL
  EXPECT_TRUE(joule::has_control_character("\u009b2J"));                            // 8-bit CSI
  EXPECT_TRUE(joule::has_control_character("a\u2028b"));
  EXPECT_TRUE(joule::has_control_character("evil\u202Etxt.exe"));
  EXPECT_TRUE(joule::has_control_character("\u2066x\u2069"));
  EXPECT_FALSE(joule::has_control_character("\u00a0\u2027\u2030"));  // neighbours are fine
  EXPECT_EQ(joule::printable("x\u0085y"), "x\\u{85}y");
  EXPECT_EQ(joule::printable("a\u2028b"), "a\\u{2028}b");
}

TEST(TextTest, control_characters_are_found) {
  EXPECT_TRUE(joule::has_control_character("a\nb"));
  EXPECT_TRUE(joule::has_control_character(std::string("a\0b", 3)));
  EXPECT_TRUE(joule::has_control_character("\x7f"));
  EXPECT_FALSE(joule::has_control_character("Jülich 東京"));
}

}  // namespace

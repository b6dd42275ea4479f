# Installs what names installed paths or must not be overwritten: the unit (its ExecStart= names
# jouled and its config), the config and the policies. Runs at install time (install(SCRIPT),
# from packaging/CMakeLists.txt), because the prefix is only known then: `cmake --install build
# --prefix /usr` and CPack's DEB staging (always /usr) must get /usr/bin/jouled and /etc/jouled
# even from a build tree configured for /usr/local.
#
# Set by packaging/CMakeLists.txt before this runs: JOULE_SOURCE_DIR, JOULE_STAGING_DIR (a
# directory of the build tree to write the unit into), JOULE_BINDIR and JOULE_SYSCONFDIR
# (GNUInstallDirs' relative or absolute values), JOULE_POLICY_FILES (config/policies.d/*.toml).

# GNUInstallDirs' rules for the configuration directory, applied to the install-time prefix:
# /usr -> /etc, /opt/<package> -> /etc/opt/<package>, any other prefix P -> P/etc.
if(IS_ABSOLUTE "${JOULE_SYSCONFDIR}")
  set(_joule_etc "${JOULE_SYSCONFDIR}")
elseif(CMAKE_INSTALL_PREFIX MATCHES "^/usr/?$")
  set(_joule_etc "/${JOULE_SYSCONFDIR}")
elseif(CMAKE_INSTALL_PREFIX MATCHES "^/opt/([^/]+)/?$")
  set(_joule_etc "/etc/opt/${CMAKE_MATCH_1}")
else()
  set(_joule_etc "${CMAKE_INSTALL_PREFIX}/${JOULE_SYSCONFDIR}")
endif()
if(IS_ABSOLUTE "${JOULE_BINDIR}")
  set(_joule_bin "${JOULE_BINDIR}")
else()
  set(_joule_bin "${CMAKE_INSTALL_PREFIX}/${JOULE_BINDIR}")
endif()

# The unit in systemd/ is written for a /usr install; other prefixes get their own paths.
file(READ "${JOULE_SOURCE_DIR}/systemd/jouled.service" _joule_unit)
string(REPLACE "/usr/bin/jouled" "${_joule_bin}/jouled" _joule_unit "${_joule_unit}")
string(REPLACE "/etc/jouled/jouled.toml" "${_joule_etc}/jouled/jouled.toml" _joule_unit "${_joule_unit}")
file(WRITE "${JOULE_STAGING_DIR}/jouled.service" "${_joule_unit}")
file(INSTALL DESTINATION "${CMAKE_INSTALL_PREFIX}/lib/systemd/system" TYPE FILE
     PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ FILES "${JOULE_STAGING_DIR}/jouled.service")

# Configuration: an existing file is an administrator's and is kept, as dpkg keeps conffiles
# (a package's staging directory is empty, so it gets every file).
function(joule_install_config source destination)
  get_filename_component(_name "${source}" NAME)
  set(_target "$ENV{DESTDIR}${destination}/${_name}")
  if(EXISTS "${_target}")
    file(READ "${_target}" _old)
    file(READ "${source}" _new)
    if(NOT _old STREQUAL _new)
      message(STATUS "Kept: ${_target} (an edited copy; the shipped one is ${source})")
    endif()
    return()
  endif()
  file(INSTALL DESTINATION "${destination}" TYPE FILE PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ
       FILES "${source}")
endfunction()
joule_install_config("${JOULE_SOURCE_DIR}/config/jouled.toml" "${_joule_etc}/jouled")
foreach(_policy IN LISTS JOULE_POLICY_FILES)
  joule_install_config("${_policy}" "${_joule_etc}/jouled/policies.d")
endforeach()

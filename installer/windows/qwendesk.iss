; Inno Setup 6 script: the Windows installer of the frozen app (dist\qwendesk\, built by installer\qwendesk.spec).
;
;   ISCC.exe /DAppVersion=0.1.0 installer\windows\qwendesk.iss      -> dist\QwenDesk-Setup-0.1.0.exe
;
; Per user, no administrator rights: it installs into %LOCALAPPDATA%\Programs\Qwen Desk. The PyTorch stack is not
; in it (the app installs the build the GPU needs at its first start), so the installer stays near 100 MB and
; needs no disk spanning (Inno Setup needs DiskSpanning=yes above about 2.1 GB; release assets stop at 2 GiB).
; The uninstaller asks whether to remove the user's data too (conversations, settings, downloaded models, the
; installed PyTorch runtime and the caches: %LOCALAPPDATA%\qwendesk); by default it keeps them.
;
; The Microsoft Visual C++ runtime (msvcp140.dll, vcruntime140_1.dll: torch's Windows DLLs need it, 14.40 or newer)
; is machine-wide and needs administrator rights: with /DVCRedist=PATH\vc_redist.x64.exe (the release workflow
; downloads it) the installer carries Microsoft's redistributable and runs it, elevated, only where the runtime is
; missing or older; without it, or when the user declines the elevation, the last page says what to install.
; Signing: /DSign with /Sqwsign="signtool sign ... $f" on ISCC's command line signs the installer and uninstaller.

#ifndef AppVersion
  #define AppVersion "0.1.0"
#endif
#define AppName "Qwen Desk"
#define AppExe "qwendesk.exe"
#define Root SourcePath + "..\.."

[Setup]
AppId={{6F1B2C9E-3D4A-4E57-9A0B-7C2D5E8F1A36}
AppName={#AppName}
AppVersion={#AppVersion}
AppPublisher=The Qwen Desk authors
DefaultDirName={autopf}\{#AppName}
DefaultGroupName={#AppName}
DisableProgramGroupPage=yes
PrivilegesRequired=lowest
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
MinVersion=10.0.17763
OutputDir={#Root}\dist
OutputBaseFilename=QwenDesk-Setup-{#AppVersion}
SetupIconFile={#Root}\build\pyinstaller\qwendesk\qwendesk.ico
UninstallDisplayIcon={app}\{#AppExe}
UninstallDisplayName={#AppName}
Compression=lzma2
SolidCompression=yes
WizardStyle=modern
CloseApplications=yes
#ifdef Sign
SignTool=qwsign
SignedUninstaller=yes
#endif

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked

[Files]
Source: "{#Root}\dist\qwendesk\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs
#ifdef VCRedist
Source: "{#VCRedist}"; DestDir: "{tmp}"; DestName: "vc_redist.x64.exe"; Flags: deleteafterinstall; Check: VCRuntimeMissing
#endif

[UninstallDelete]
; bytecode that versions before 0.1.1 wrote beside the app's .py sources (the app now writes none under {app})
Type: filesandordirs; Name: "{app}\_internal\qwendesk_kernels\__pycache__"

[Icons]
Name: "{autoprograms}\{#AppName}"; Filename: "{app}\{#AppExe}"
Name: "{autodesktop}\{#AppName}"; Filename: "{app}\{#AppExe}"; Tasks: desktopicon

[Run]
#ifdef VCRedist
Filename: "{tmp}\vc_redist.x64.exe"; Parameters: "/install /quiet /norestart"; Verb: "runas"; StatusMsg: "Installing the Microsoft Visual C++ runtime..."; Flags: shellexec waituntilterminated; Check: VCRuntimeMissing
#endif
Filename: "{app}\{#AppExe}"; Description: "{cm:LaunchProgram,{#AppName}}"; Flags: nowait postinstall skipifsilent

[Code]
const
  VCRuntimeKey = 'SOFTWARE\Microsoft\VisualStudio\14.0\VC\Runtimes\x64';
  VCRuntimeURL = 'https://aka.ms/vs/17/release/vc_redist.x64.exe';

// The Visual C++ 2015-2022 runtime, 14.40 or newer (what torch's DLLs are built against), installed machine-wide.
function VCRuntimeMissing(): Boolean;
var
  Installed, Major, Minor: Cardinal;
begin
  Result := not (RegQueryDWordValue(HKLM64, VCRuntimeKey, 'Installed', Installed) and (Installed = 1) and
    RegQueryDWordValue(HKLM64, VCRuntimeKey, 'Major', Major) and
    RegQueryDWordValue(HKLM64, VCRuntimeKey, 'Minor', Minor) and ((Major > 14) or ((Major = 14) and (Minor >= 40))));
end;

procedure CurPageChanged(CurPageID: Integer);
begin
  if (CurPageID = wpFinished) and VCRuntimeMissing() and not WizardSilent() then
    MsgBox('Qwen Desk''s engine needs the Microsoft Visual C++ runtime (2015-2022, 14.40 or newer), which is not ' +
      'installed on this computer. Install it from ' + VCRuntimeURL + ' (administrator rights needed), then start ' +
      'Qwen Desk.', mbInformation, MB_OK);
end;

// The app's data folder: platformdirs' user data dir for "qwendesk" (its runtime and caches live below it).
function UserDataDir(): String;
begin
  Result := ExpandConstant('{localappdata}\qwendesk');
end;

procedure CurUninstallStepChanged(CurUninstallStep: TUninstallStep);
begin
  if (CurUninstallStep = usPostUninstall) and DirExists(UserDataDir()) then
    if (not UninstallSilent()) and (MsgBox('Also remove your Qwen Desk data?' + #13#10#13#10 +
        'Conversations, settings, downloaded models, the installed PyTorch engine and caches in ' + UserDataDir() +
        '. Choose No to keep them for a later install.', mbConfirmation, MB_YESNO or MB_DEFBUTTON2) = IDYES) then
      DelTree(UserDataDir(), True, True, True);
end;
